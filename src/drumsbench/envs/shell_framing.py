"""A policy's shell command run in a sandbox with its end framed by the harness (coding, harbor).

Contract of ``framed_shell(box, command, generation, step, ...)``: the policy's command runs in a
child shell; the harness's outer shell prints an end marker (the generation, the step and a fresh
random part) and the command's status after it. The command cannot
close or replace the outer shell's output, so what it does to its own streams (``exec prog``,
``exec 1>&-``, killing itself) is its own business: a valid observation. It does share the outer
shell's open stdout, so it can make it non-blocking and keep the pipe full: the outer shell writes
its marker again until it lands (``WRAP``), and the command cannot make that write fail. A missing
marker is a transport fault only with evidence (``content["lost"]``, read by ``lost_problem``): the
outer shell exited by itself (status 0-125: not killed by a signal, which the command could send it,
and not a container runtime's own 126/127 for a program it could not start, e.g. a /bin/sh the
command removed), nothing timed out and the output was not truncated — then bytes were lost between
sandbox and harness. Output after the marker (a background process) is cut off, never parsed.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from drumsbench.substrates.base import ExecResult, Sandbox

OBS_LIMIT = 16 * 1024
# $1: the policy's command, run by a child shell; $2: the end marker, printed by this outer shell.
# The child shares the outer shell's stdout (one open pipe): it can make it non-blocking and keep
# the pipe full, so one marker write can fail (EAGAIN). The outer shell writes the marker again
# until it lands: one write of under PIPE_BUF bytes, atomic, lands whole or not at all, and the
# harness drains the pipe throughout; a pipe kept full for good is truncated output or a step past
# its limit, both the policy's. A reader gone kills the shell by SIGPIPE (a signal: no claim).
WRAP = ('/bin/sh -c "$1"; s=$?; '
        'until printf "\\n%s %d\\n" "$2" "$s"; do sleep 0.01; done 2>/dev/null; exit $s')
# Exit statuses a container runtime (docker, podman) gives when it could not start the program
# at all: the outer shell never ran, so no claim about its marker can be made from them.
RUNTIME_COULD_NOT_START = (126, 127)


def command_content(res: ExecResult) -> dict[str, object]:
    """An observation's content of one command's result: {exit_code, stdout, stderr, truncated}."""
    return {"exit_code": res.exit_code, "stdout": res.stdout.decode(errors="replace"),
            "stderr": res.stderr.decode(errors="replace"), "truncated": res.truncated}


def framed_shell(box: Sandbox, command: str, generation: int, step: int, timeout: float, *,
                 cwd: str | None = None, env: Mapping[str, str] | None = None) -> tuple[dict[str, object], bool]:
    """The observation's content ({exit_code, stdout, stderr, truncated[, lost]}) and whether the
    command timed out (module contract)."""
    marker = f"__DRUMSBENCH_END_{generation}_{step}_{secrets.token_hex(4)}__"
    res = box.exec(["/bin/sh", "-c", WRAP, "drumsbench", command, marker], timeout=timeout,
                   output_limit=OBS_LIMIT, cwd=cwd, env=env)
    out = res.stdout
    cut = out.rfind(f"\n{marker} ".encode())
    content: dict[str, object] = {"stderr": res.stderr.decode(errors="replace"),
                                  "truncated": res.truncated, "exit_code": res.exit_code,
                                  "stdout": (out[:cut] if cut >= 0 else out).decode(errors="replace")}
    if (cut < 0 and 0 <= res.exit_code < 128 and res.exit_code not in RUNTIME_COULD_NOT_START
            and not res.timed_out and not res.truncated):
        # The outer shell exited by itself (not by a signal: negative here, 128+N in containers,
        # which the policy's command can send to it; not the runtime's 126/127, which a command
        # that removed or spoiled /bin/sh in a container gets), yet its marker never arrived.
        content["lost"] = True
    return content, res.timed_out


def lost_problem(content: Mapping[str, object]) -> str | None:
    """Gate 4's reason for a framed observation whose marker was lost in transport, or None."""
    if not content.get("lost"):
        return None
    err = str(content.get("stderr", ""))[-160:]
    return (f"the end marker of a normally ended command never arrived: output lost in transport "
            f"(exit {content.get('exit_code')}, stderr {err!r})")
