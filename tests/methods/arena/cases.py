"""The ARENA tests' shared cases: the paper's case-study question with ten references (gold 6 and
8), a well-formed reply, and a one-turn trajectory as the engine parses it."""

from ragrl.data.references import GOLD_REFERENCE_KEY
from ragrl.data.schema import Example, Passage
from ragrl.methods.arena.protocol import ArenaProtocol
from ragrl.rollout.trajectory import Segment, Trajectory

PASSAGES = [
    Passage(f"p{i}", f"Title {i}", f"Text of passage {i}.") for i in range(1, 11)
]  # 10 references, gold 6 and 8 as in the paper's case study
EX = Example(
    "q1",
    "What party was the secretary of commerce and housing under the 42 Governor of Kansas?",
    ["Republican"],
    supporting_ids=["p6", "p8"],
    passages=PASSAGES,
    metadata={GOLD_REFERENCE_KEY: [6, 8]},
)
GOOD = (
    "<relevance>[6,8]</relevance>\n"
    "<analysis>Finney was governor [6]. Knight served under her [8].</analysis>\n"
    "<answer>Republican</answer>"
)


def traj(text: str, example_id: str = "q1") -> Trajectory:
    """A one-turn trajectory whose policy segment holds ``text``, parsed as the engine would."""
    action = ArenaProtocol().parse(text, 0)
    final = action.content if action.kind == "answer" else None
    return Trajectory(
        example_id, [1], segments=[Segment("policy", [7], text, [0.0])], actions=[action], final_answer=final
    )
