"""Rebuild a ``Trajectory`` from saved completion text, to re-score logged runs (``ragrl reward``).

A completion is the generated text after the prompt, observations included. The protocol says where
the environment's text is (``Protocol.env_spans``); everything else is policy text, split into turns
at those spans and, as a backend would have stopped, right after the first stop string of a turn;
each turn is parsed as during the rollout, and an episode ends at its final action, unless the
protocol's ``after_answer`` asks for a reflection pass: that pass is the rest of the saved text, read to
its end however many answers it gives (a live rollout stops at the passes the protocol asks for, but
saved text may come from anywhere; TIRESRAG-R1's code and spec take the last answer as the prediction).
An end token's text (``<|im_end|>``, ``</s>``: ``END_TOKEN_TEXT``) ends the episode, as EOS ends a live
one. Token
ids are not available from text, so segments carry none; search actions carry no retrieved ids.
Rewards that read only text, actions and the final answer score such a trajectory exactly as the live
one.
"""

from __future__ import annotations

from pathlib import Path

from ragrl.data.io import iter_jsonl
from ragrl.errors import DataError
from ragrl.rollout.backtrack import active_steps
from ragrl.rollout.protocol import END_TOKEN_TEXT, Protocol, read_turn, squash_ws
from ragrl.rollout.records import trajectory_from_record
from ragrl.rollout.trajectory import Action, Segment, Trajectory


def trajectory_from_completion(
    example_id: str, completion: str, protocol: Protocol, *, fallback: bool = False
) -> Trajectory:
    """The episode of one saved completion (see the module docstring); with ``fallback`` a turn the
    protocol cannot read is taken as the answer, as the live rollout does under
    ``rollout.invalid_fallback: answer``."""
    traj = Trajectory(example_id=example_id, prompt_ids=[], metadata={"replayed_from_text": True})
    position = 0
    pieces: list[tuple[str, str]] = []
    for start, end in protocol.env_spans(completion):
        if start < position:
            continue  # overlapping spans: keep the first
        pieces.append(("policy", completion[position:start]))
        pieces.append(("env", completion[start:end]))
        position = end
    pieces.append(("policy", completion[position:]))

    turn, ended, reflecting = 0, False, False
    for kind, text in pieces:
        if ended:
            break
        if kind == "env":
            traj.segments.append(Segment("env", [], text))
            continue
        for turn_text in _split_at_stops(text, protocol.stop):
            end = END_TOKEN_TEXT.search(turn_text)
            if end:  # the response ends at an end token, as a live rollout at EOS
                turn_text, ended = turn_text[: end.end()], True
            traj.segments.append(Segment("policy", [], turn_text, []))
            if not turn_text.strip():
                continue  # whitespace between observations is not a turn
            hops = len(active_steps(traj.actions, turn))
            action, _ = read_turn(protocol, turn_text, turn, hops, fallback=fallback and not reflecting)
            if reflecting and action.kind == "invalid":  # a declined reflection ends it (as live)
                traj.actions.append(Action("reflect", content=squash_ws(turn_text), turn=turn))
                ended = True
                break
            traj.actions.append(action)
            turn += 1
            if protocol.is_final(action):
                traj.final_answer = action.content
                # a protocol that asks for one more pass (a reflection) goes on with the text after it,
                # to the end of the text: every later answer is kept and the last one is final
                if not reflecting and protocol.after_answer(traj, action) is None:
                    ended = True
                    break
                reflecting = True
            if ended:
                break
    traj.finish_reason = "no_answer" if traj.final_answer is None else "answer"
    return traj


def _split_at_stops(text: str, stops: tuple[str, ...]) -> list[str]:
    """``text`` cut right after each first-occurring stop string (a backend's turn boundaries)."""
    turns: list[str] = []
    while text:
        ends = [i + len(s) for s in stops if s and (i := text.find(s)) >= 0]
        if not ends:
            break
        cut = min(ends)
        turns.append(text[:cut])
        text = text[cut:]
    if text or not turns:
        turns.append(text)
    return turns


def read_completions(path: str | Path, protocol: Protocol, *, fallback: bool = False) -> list[Trajectory]:
    """The episodes of a completions file, one per jsonl line: either ``{id, completion}`` (the text,
    rebuilt with ``trajectory_from_completion``, ``fallback`` as there) or a saved trajectory
    (``{segments, ...}``). Errors name the file, the line and the field."""
    out = []
    for line, record in iter_jsonl(path):
        if not isinstance(record, dict):
            raise DataError("expected a JSON object", path=path, line=line)
        if "segments" in record:
            out.append(trajectory_from_record(record, path, line))
            continue
        for key in ("id", "completion"):
            if key not in record:
                raise DataError("missing", path=path, line=line, field=key)
        if not isinstance(record["id"], (str, int)) or isinstance(record["id"], bool):
            raise DataError("must be a string or an integer", path=path, line=line, field="id")
        if not isinstance(record["completion"], str):
            raise DataError("must be a string", path=path, line=line, field="completion")
        custom = protocol.replay(record, path, line, fallback=fallback)
        if custom is None:
            custom = trajectory_from_completion(
                str(record["id"]), record["completion"], protocol, fallback=fallback
            )
        out.append(custom)
    return out
