"""The seen/unseen split of an IR split's queries against the training judgements, on a hand-made qrels."""
import numpy as np

from headstore.heads.kinds.ranking import IRSplit
from headstore.heads.kinds.seen import judged_documents, seen_mask, split_counts


def _split() -> IRSplit:
    doc_ids = ["d0", "d1", "d2", "d3"]
    doc_rows = np.array([10, 11, 12, 13], dtype=np.int64)
    qrels = {
        "q0": {"d0": 1},               # d0 judged in training: seen
        "q1": {"d2": 1, "d3": 1},      # neither judged: unseen
        "q2": {"d3": 0, "d1": 2},      # d1 judged: seen (grade 2)
        "q3": {"d0": 0},               # d0 judged but graded 0 here: not relevant, so unseen
        "q4": {},                      # no relevant document: unseen
    }
    qids = sorted(qrels)
    return IRSplit(qids, np.arange(len(qids), dtype=np.int64), doc_ids, doc_rows, qrels)


def test_seen_mask_matches_a_hand_made_qrels():
    judged = judged_documents(np.array([10, 11, 10, 99]))  # 99: a judged document outside this corpus
    mask = seen_mask(_split(), judged)
    assert mask.tolist() == [True, False, True, False, False]
    assert split_counts(mask) == {"seen": 2, "unseen": 3, "all": 5}


def test_no_training_judgements_is_all_unseen():
    mask = seen_mask(_split(), judged_documents([]))
    assert not mask.any() and split_counts(mask)["unseen"] == 5


def test_relevant_pairs_are_the_positive_judgements_in_the_corpus():
    from headstore.heads.kinds.seen import relevant_pairs

    q, d = relevant_pairs(_split())
    assert list(zip(q.tolist(), d.tolist())) == [(0, 10), (1, 12), (1, 13), (2, 11)]  # q2's d3 and q3's d0: grade 0
