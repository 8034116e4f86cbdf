"""The train report's models live in ``measure/train_report.py`` (the renderers read them there)."""

from drumsbench.measure.train_report import Comparison, Curve, CurvePoint, FinalEval, TrainReport, TreatmentCost

__all__ = ["Comparison", "Curve", "CurvePoint", "FinalEval", "TrainReport", "TreatmentCost"]
