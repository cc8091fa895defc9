"""The featurize command finetune.json suggests gives the tuned encoder's store the numerics, dtype and prompts
of the store the head was trained on (each is a fingerprint part: a store made otherwise is refused by the head)."""
from headstore.heads.apply.finetune_outputs import _featurize_options


def test_the_suggested_featurize_keeps_the_stores_numerics_dtype_and_prompts():
    assert _featurize_options({"dtype": "float16", "precision": "fp32"}) == " --dtype float16"
    assert _featurize_options({"dtype": "float16", "precision": "bf16"}) == " --dtype float16 --precision bf16"
    weights = _featurize_options({"dtype": "float32", "precision": "bf16", "numerics": "bf16-weights"})
    assert weights == " --dtype float32 --precision bf16-weights"
    prompted = _featurize_options({"dtype": "float16", "prompts": {"query": "query: "}})
    assert prompted == " --dtype float16 --query-prompt 'query: ' --document-prompt ''"
