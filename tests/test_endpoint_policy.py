"""The endpoint policy against a scripted OpenAI-compatible server on loopback (the real ``openai``
client): a model that solves succeeds; the endpoint unreachable, timing out, 429 or 5xx after the
bounded retries is invalid/policy_unavailable; a well-formed answer that is not a valid action is the
policy's own failed step; tokens and latency of every call are in the record."""

from __future__ import annotations

import json
import socket
import sqlite3
from pathlib import Path

import pytest
from loopback_openai import LoopbackOpenAI

from drumsbench.core.errors import UsageError
from drumsbench.core.outcome import InvalidCause, Outcome
from drumsbench.envs.coding.task import load_suite
from drumsbench.envs.harbor import interpreter
from drumsbench.policies.endpoint import EndpointPolicy, policy_name
from drumsbench.policies.scripted import make_policy
from drumsbench.rollout.attempt import RolloutConfig, run_attempt
from drumsbench.rollout.isolation import CanaryRegistry
from drumsbench.substrates import registry

from conftest import require
from helpers import cli, slot_on

HARBOR = Path(__file__).resolve().parents[1] / "examples" / "harbor"

pytestmark = pytest.mark.timeout(300)

CFG = RolloutConfig(step_timeout_s=20, episode_timeout_s=60, max_steps=8)


@pytest.fixture(scope="module")
def endpoint():
    with LoopbackOpenAI() as server:
        yield server


def attempt(state_dir, run_id, policy, task_index=0):
    slot = slot_on("process", run_id, state_dir)
    try:
        return run_attempt(slot, load_suite("coding")[task_index], policy, CFG, CanaryRegistry(),
                           run_id=run_id, seq=0, seed=0)
    finally:
        slot.destroy()
        slot.substrate.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_model_that_solves_succeeds_with_tokens_and_latency(endpoint, state_dir, run_id):
    rec = attempt(state_dir, run_id, EndpointPolicy(endpoint.url, "oracle", timeout_s=10, retries=0))
    assert rec.outcome is Outcome.SUCCESS, rec.detail
    inf = rec.extra["inference"]
    assert inf["calls"] == len(load_suite("coding")[0].oracle_plan())
    assert inf["prompt_tokens"] == 100 * inf["calls"] and inf["completion_tokens"] == 20 * inf["calls"]
    assert all(s["latency_s"] >= 0 and s["prompt_tokens"] == 100 for s in inf["steps"])
    assert rec.policy == "endpoint:oracle"


def test_a_bad_answer_is_a_failed_step_the_policy_sees_and_the_attempt_goes_on(endpoint, state_dir, run_id):
    policy = EndpointPolicy(endpoint.url, "flaky-oracle", timeout_s=10, retries=0)
    rec = attempt(state_dir, run_id, policy)
    assert rec.outcome is Outcome.SUCCESS, rec.detail
    assert rec.extra["inference"]["steps"][0]["problem"] == "the answer called no tool"
    # the next prompt told the model what was wrong
    told = [m for m in policy.messages if "not a valid action" in str(m.get("content"))]
    assert told and "called no tool" in told[0]["content"]


@pytest.mark.parametrize("model,problem", [("no-tool", "called no tool"), ("unknown-tool", "unknown tool"),
                                           ("bad-args", "not JSON"), ("args-object", "not a JSON string (a dict)"),
                                           ("name-list", "unknown tool [\"shell\"]")])
def test_answers_that_are_not_actions_are_the_policys_failure(endpoint, state_dir, run_id, model, problem):
    rec = attempt(state_dir, run_id, EndpointPolicy(endpoint.url, model, timeout_s=10, retries=0))
    assert rec.outcome is Outcome.FAILED and rec.reward == 0.0, rec.detail
    assert rec.detail.startswith("truncated")  # every answer was a failed step, up to the step limit
    assert all(problem in s["problem"] for s in rec.extra["inference"]["steps"][:CFG.max_steps])


@pytest.mark.parametrize("model,requests", [("rate-limited", 3), ("broken", 3), ("unauthorized", 1),
                                            ("not-json", 1), ("usage-string", 1), ("choices-object", 1)])
def test_endpoint_faults_after_bounded_retries_are_policy_unavailable(endpoint, state_dir, run_id, model, requests):
    before = endpoint.requests[model]
    rec = attempt(state_dir, run_id, EndpointPolicy(endpoint.url, model, timeout_s=10, retries=2))
    assert rec.outcome is Outcome.INVALID and rec.reward is None, rec.detail
    assert rec.cause is InvalidCause.POLICY_UNAVAILABLE
    assert endpoint.requests[model] - before == requests  # the retries are bounded (and only for 429/5xx)
    assert rec.extra["inference"]["steps"][0]["error"]


def test_timeout_and_unreachable_are_policy_unavailable(endpoint, state_dir, run_id):
    rec = attempt(state_dir, run_id, EndpointPolicy(endpoint.url, "slow", timeout_s=0.3, retries=1))
    assert (rec.outcome, rec.cause) == (Outcome.INVALID, InvalidCause.POLICY_UNAVAILABLE), rec.detail
    assert "Timeout" in rec.detail
    rec = attempt(state_dir, run_id, EndpointPolicy(f"http://127.0.0.1:{closed_port()}/v1", "oracle",
                                                     timeout_s=2, retries=1))
    assert (rec.outcome, rec.cause) == (Outcome.INVALID, InvalidCause.POLICY_UNAVAILABLE), rec.detail
    assert "Connection" in rec.detail


def test_a_request_the_endpoint_refuses_as_too_long_is_the_policys_failure(endpoint, state_dir, run_id):
    rec = attempt(state_dir, run_id, EndpointPolicy(endpoint.url, "too-long", timeout_s=10, retries=2))
    assert rec.outcome is Outcome.FAILED, rec.detail
    assert "HTTP 400" in rec.detail


def test_policy_flags():
    assert policy_name("endpoint", "http://127.0.0.1:1/v1", "m") == "endpoint:m@http://127.0.0.1:1/v1"
    p = make_policy("endpoint:org/model-7b@http://127.0.0.1:9/v1")
    assert (p.url, p.model) == ("http://127.0.0.1:9/v1", "org/model-7b")
    for args, flag in [(("endpoint", None, "m"), "--endpoint"), (("endpoint", "ftp://x", "m"), "--endpoint"),
                       (("endpoint", "http://127.0.0.1:1/v1", None), "--model"),
                       (("oracle", "http://127.0.0.1:1/v1", None), "--endpoint")]:
        with pytest.raises(UsageError, match=flag):
            policy_name(*args)


def test_the_endpoint_works_a_harbor_task_with_that_kinds_own_tools(tmp_path):
    """The endpoint policy is the kind's, not coding's: on Harbor tasks (overlay) the model is offered
    the harbor kind's tools (``shell``, ``write``, ``submit``: what the realistic agent uses), and a
    model that follows each task's oracle through them scores 1 on every attempt."""
    require(interpreter.missing())
    require(registry.get("overlay").missing())
    env = {"DRUMSBENCH_STATE": str(tmp_path / "state")}
    out = tmp_path / "runs"
    with LoopbackOpenAI(f"harbor:{HARBOR}") as server:
        proc = cli("run", "--tasks", f"harbor:{HARBOR}", "--substrate", "overlay", "--policy", "endpoint",
                   "--endpoint", server.url, "--model", "oracle", "--attempts", "3", "--concurrency", "1",
                   "--duration", "300s", "--out", str(out), "--no-progress", env=env)
        tools = set(server.tools)
    assert proc.returncode == 0, proc.stderr
    assert tools == {"shell", "write", "submit"}, tools
    db = sqlite3.connect(out / "ledger.sqlite")
    rows = db.execute("SELECT task, outcome, json_extract(extra, '$.inference.calls') FROM attempts").fetchall()
    db.close()
    assert len(rows) == 3 and all(r[1] == "success" and r[2] > 0 for r in rows), rows


def test_run_with_the_endpoint_policy_is_one_flag(endpoint, tmp_path):
    env = {"DRUMSBENCH_STATE": str(tmp_path / "state")}
    out = tmp_path / "runs"
    bad = cli("run", "--policy", "endpoint", "--model", "oracle", "--out", str(out), env=env)
    assert bad.returncode == 2 and "--endpoint" in bad.stderr and "Traceback" not in bad.stderr
    proc = cli("run", "--policy", "endpoint", "--endpoint", endpoint.url, "--model", "oracle", "--attempts", "2",
               "--concurrency", "1", "--duration", "120s", "--out", str(out), "--no-progress", env=env)
    assert proc.returncode == 0, proc.stderr
    db = sqlite3.connect(out / "ledger.sqlite")
    rows = db.execute("SELECT policy, outcome, json_extract(extra, '$.inference.calls'), "
                      "json_extract(extra, '$.inference.prompt_tokens'), "
                      "json_extract(extra, '$.inference.completion_tokens') FROM attempts").fetchall()
    run_id = db.execute("SELECT run_id FROM runs").fetchone()[0]
    db.close()
    assert len(rows) == 2 and all(r[0] == "endpoint:oracle" and r[1] == "success" and r[2] > 0 for r in rows), rows
    # the measured tokens enter the cost per 1,000 verified attempts at a price per million tokens
    prices = tmp_path / "tokens.toml"
    prices.write_text('schema = "drumsbench.prices/1"\n[cloud]\nname = "c"\nusd_per_hour = 0.1\n'
                      "[attribution]\ninference_usd_per_million_input_tokens = 3.0\n"
                      "inference_usd_per_million_output_tokens = 15.0\n")
    rep = cli("report", run_id, "--out", str(out), "--price", str(prices), "--json", str(tmp_path / "r.json"), env=env,
              check=True)
    (attribution,) = json.loads((tmp_path / "r.json").read_text())["costs"]["attribution"]
    line = next(ln for ln in attribution["lines"] if ln["name"] == "GPU / inference")
    tokens_in, tokens_out = sum(r[3] for r in rows), sum(r[4] for r in rows)
    assert tokens_in > 0 and line["source"] == "measured+input"
    assert line["usd"] == pytest.approx(3.0 * tokens_in / 1e6 + 15.0 * tokens_out / 1e6)
    # the terminal table wraps its "how" column at the console's width: the words are checked in the JSON
    assert "input tokens" in line["detail"] and "GPU / inference" in rep.stdout
