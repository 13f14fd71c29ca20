"""Answer, supporting-fact and retrieval metrics, LLM-as-a-judge, and the ``ragrl score`` engine.

Normalization is chosen by name (``variant=``): see ``ragrl.metrics.normalize`` and docs/metrics.md.
"""

from ragrl.metrics.answer import (
    ANSWER_METRICS,
    answer_scores,
    contains_answer,
    cover_em,
    exact_match,
    f1,
    substring_acc,
)
from ragrl.metrics.judge import (
    JUDGE_SYSTEM,
    JUDGE_TEMPLATE,
    judge_answer,
    judge_answers,
    judge_messages,
    judge_prompt,
    parse_judgement,
)
from ragrl.metrics.judge_clients import CachedJudge, JudgeClient, LocalJudge, OpenAIJudge, make_judge
from ragrl.metrics.normalize import (
    VARIANTS,
    Variant,
    get_normalizer,
    get_variant,
    normalize,
    variant_names,
)
from ragrl.metrics.retrieval import (
    aggregate_retrieval,
    answer_recall_at_k,
    average_precision,
    full_recall_at_k,
    precision_at_k,
    recall_at_k,
    reciprocal_rank,
    retrieval_scores,
)
from ragrl.metrics.support import (
    JointScores,
    SupportScores,
    joint_scores,
    parse_supporting_facts,
    supporting_fact_scores,
)

__all__ = [
    "ANSWER_METRICS",
    "JUDGE_SYSTEM",
    "JUDGE_TEMPLATE",
    "VARIANTS",
    "JointScores",
    "CachedJudge",
    "JudgeClient",
    "LocalJudge",
    "OpenAIJudge",
    "SupportScores",
    "Variant",
    "aggregate_retrieval",
    "answer_recall_at_k",
    "answer_scores",
    "average_precision",
    "contains_answer",
    "cover_em",
    "exact_match",
    "f1",
    "full_recall_at_k",
    "get_normalizer",
    "get_variant",
    "joint_scores",
    "judge_answer",
    "judge_answers",
    "judge_messages",
    "judge_prompt",
    "make_judge",
    "normalize",
    "parse_judgement",
    "parse_supporting_facts",
    "precision_at_k",
    "recall_at_k",
    "reciprocal_rank",
    "retrieval_scores",
    "substring_acc",
    "supporting_fact_scores",
    "variant_names",
]
