"""The edge answering alone when the cloud cannot (issue 35): time from losing the cloud mid-clip to the
clip's end, with today's behaviour (`--on-cloud-failure fail`) and with the edge's fallback.

    python bench/fallback.py [--clip samples/m_slow_low.wav] [--out docs/results/bench-fallback.json]

Per scenario it starts a real `specdec serve` on 127.0.0.1 (a free port, stopped by its pid) and puts a
relay in front of it (tests/cloud_relay.py) that acts at the clip's second verification, before
forwarding it:

* `killed`: SIGKILL the server by its pid and stop accepting connections (a crashed server: the
  request in flight is dropped, later connections are refused);
* `hung`: SIGSTOP the server by its pid and forward the request (a server that takes connections
  and never answers: a wedged GPU, a swapped-out host).

The clip (quality preset, greedy) is described through the library (`specdec.Pair`, as `describe`
and `batch` do) with each policy: `fail` and no deadline (the behaviour before the fallback
existed: the retry window of SPECDEC_CLOUD_RETRY_S, default 20 s, for an unreachable server; the
request's own 60 s deadline for a silent one), and `edge` with the `describe` default deadline
(10 s) and the `batch` default (30 s). It reports, per run, the seconds from the loss (the relay's
action) to the clip's end, the clip's whole time, its outcome (the failure, or the fallback and the
tokens the cloud had verified) and, for `edge`, whether the description equals the edge's own
continuation from the verified prefix (the loop's oracle in tests/test_cloud_fallback.py); then
the seconds the next clip (`--next-clip`) takes with the same client, the cloud still gone, as the
next clip of a batch would. One run per cell: each costs up to a minute of waiting (that is what is measured), not of CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for where in (REPO, REPO / "tests"):  # the relay is the tests' (one copy)
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))

from cloud_relay import Relay  # noqa: E402

from specdec_cli.remote.local_server import LocalServer  # noqa: E402

POLICIES = [("fail", None), ("edge", 10.0), ("edge", 30.0)]


def describe(pair: Any, clip: Path) -> dict[str, Any]:
    """The clip's outcome: its fallback fields and description, or the failure `fail` gives it."""
    try:
        result = pair.describe(clip, preset="quality")
    except Exception as exc:  # the clip's failure, as `fail` reports it
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    outcome: dict[str, Any] = {k: result.record[k] for k in
                               ("fallback", "fallback_at_tokens", "fallback_verified_tokens", "tokens")}
    outcome["description"] = result.description
    return outcome


def one(scenario: str, policy: str, deadline_s: float | None, clip: Path, after: Path) -> dict[str, Any]:
    from specdec import Pair

    lost_at: list[float] = []
    server = LocalServer().start()

    def before(n: int) -> bool:
        if n < 2:
            return False
        if not lost_at:
            lost_at.append(time.monotonic())
            if scenario == "killed":
                server.kill()
                relay.refuse()
            else:
                os.kill(server.proc.pid, signal.SIGSTOP)
        return scenario == "killed"

    try:
        with Relay(server.port, before) as relay:
            pair = Pair(cloud=relay.url, on_cloud_failure=policy, cloud_deadline=deadline_s)
            started = time.monotonic()
            outcome = describe(pair, clip)
            ended = time.monotonic()
            # The next clip of a batch, the cloud still gone: what each clip after the loss costs.
            following = describe(pair, after)
            next_s = time.monotonic() - ended
            pair.models.remote.close()
    finally:
        server.kill()  # SIGKILL ends a stopped process too
    return {"scenario": scenario, "policy": policy, "deadline_s": deadline_s,
            "loss_to_end_s": round(ended - lost_at[0], 2) if lost_at else None,
            "clip_s": round(ended - started, 2), **outcome, "next_clip": str(after.relative_to(REPO)),
            "next_clip_s": round(next_s, 2),
            "next_outcome": following.get("fallback") or following.get("error", "").split(":")[0]}


def oracle_check(rows: list[dict[str, Any]], clip: Path) -> None:
    """Mark each fallback row with whether its description is the edge's own continuation from
    the prefix it had when the cloud failed (tests/test_cloud_fallback.py's oracle)."""
    from test_cloud_fallback import expected

    from specdec import Pair

    pair = Pair()
    for row in rows:
        if row.get("fallback"):
            text, tokens = expected(pair, clip, row["fallback_at_tokens"])
            row["equals_edge_continuation"] = (row["description"], row["tokens"]) == (text, tokens)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clip", type=Path, default=REPO / "samples/m_slow_low.wav")
    parser.add_argument("--next-clip", type=Path, default=REPO / "samples/f_fast_high.wav")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    os.environ.pop("SPECDEC_CLOUD_RETRY_S", None)  # the defaults are what is measured
    os.environ.pop("SPECDEC_CLOUD_TIMEOUT", None)
    rows = [one(scenario, policy, deadline, args.clip, args.next_clip) for scenario in ("killed", "hung")
            for policy, deadline in POLICIES]
    oracle_check(rows, args.clip)
    out = {"command": "python bench/fallback.py" + (f" --out {args.out}" if args.out else ""),
           "clip": str(args.clip.relative_to(REPO)) if args.clip.is_relative_to(REPO) else str(args.clip),
           "preset": "quality", "loss": "at the clip's second verification", "rows": rows}
    text = json.dumps(out, ensure_ascii=False, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(table(out))
    return out


def table(out: dict[str, Any]) -> str:
    lines = ["| cloud lost | policy | deadline | loss → clip's end | clip | outcome | next clip |",
             "|---|---|---|---|---|---|---|"]
    for r in out["rows"]:
        if "error" in r:
            what = f"failed: {r['error'].split(':')[0]}"
        else:
            what = (f"edge finished it ({r['fallback']}; {r['fallback_verified_tokens']} of {r['tokens']} tokens "
                    f"checked by the cloud; edge continuation: {'yes' if r.get('equals_edge_continuation') else 'NO'})")
        deadline = "none" if r["deadline_s"] is None else f"{r['deadline_s']:g} s"
        lines.append(f"| {r['scenario']} | {r['policy']} | {deadline} | {r['loss_to_end_s']:.1f} s | "
                     f"{r['clip_s']:.1f} s | {what} | {r['next_clip_s']:.1f} s ({r['next_outcome']}) |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
