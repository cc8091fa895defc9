"""Unpadded ("packed") batches (featurize.encoder.packed) give the padded batches' features: on the CPU in fp32
within 1e-5, for every architecture that packs (the others keep padded batches and say why), several
poolings, prompts left out of the pooling, several layers, texts of very different lengths and a batch of
one; the packed plan fills its token budget and resumes exactly; packing is no fingerprint part."""
from __future__ import annotations

import numpy as np
import pytest
from arch_models import ARCHES, build_hf, build_st, has_arch
from featurize_helpers import random_texts

from headstore.data.text_id import text_ids
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.encoder.encode import plan_batches
from headstore.featurize.encoder.model import load_encoder
from headstore.featurize.encoder.varlen import CPU_KERNELS
from headstore.featurize.encoder.packed import PACKABLE, prepare_encoder
from headstore.featurize.encoder.resolved import resolve
from headstore.featurize.run.windows import encode_in_plan_order
from headstore.featurize.run.local import featurize_texts
from headstore.featurize.store.reader import FeatureStore

pytest.importorskip("sentence_transformers")

# one word to past the 24-token max length (truncated), in one batch: the lengths differ by 20x
TEXTS = random_texts(12, seed=5, max_words=40) + ["one", "Cat Dog", "a b"]
# mean alone (packed: a segment mean), and every other mode concatenated then a Dense (the padded scatter)
SETUPS = {"mean": ("mean", None),
          "other-modes-dense": (("cls", "max", "weightedmean", "mean_sqrt_len_tokens", "lasttoken"), 16)}


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("packed-arches")
    return {arch: build_hf(root / arch, arch) for arch in ARCHES if has_arch(arch)}


def features(model_dir, texts, packing: str, kernels=None, prompts="", **kw) -> tuple[dict, object]:
    """{array name: (N, D) float32 in input order} of an fp32 CPU encode, and the encoder's EncodePath."""
    config = FeaturizeConfig(model=str(model_dir), dtype="float32", device="cpu", precision="fp32",
                             packing=packing, batch_tokens=64, **kw)
    settings = resolve(config)
    encoder = load_encoder(config.model, "cpu", config.max_length)
    path = prepare_encoder(encoder, settings.numerics, settings.packing, kernels=kernels)
    out: dict[str, np.ndarray] = {}
    for idx, feats, _, _ in encode_in_plan_order(settings, encoder, text_ids(texts), texts, prompts):
        for name, rows in feats.items():
            out.setdefault(name, np.zeros((len(texts), rows.shape[1]), dtype=np.float32))[idx] = rows
    return out, path


def assert_same(a: dict, b: dict, tol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert np.abs(a[name] - b[name]).max() <= tol, name


@pytest.mark.parametrize("setup", sorted(SETUPS))
@pytest.mark.parametrize("arch", ARCHES)
def test_packed_equals_padded_or_falls_back_saying_why(arch, setup, hf_models, tmp_path):
    if arch not in hf_models:
        pytest.skip(f"transformers has no {arch}")
    modes, dense = SETUPS[setup]
    st_dir = build_st(tmp_path / "st", hf_models[arch], modes, dense)
    padded, off = features(st_dir, TEXTS, "off")
    packed, on = features(st_dir, TEXTS, "on")
    assert off.packing is False and off.packing_reason is None  # not asked for
    if arch in PACKABLE:
        assert on.packing and on.attention_kernel in CPU_KERNELS and on.packing_reason is None
    else:
        assert not on.packing and arch in on.packing_reason and on.attention_kernel == "padded"
    assert_same(packed, padded)


@pytest.mark.parametrize("kernel", ["sdpa_loop", "nested_sdpa"])
def test_every_cpu_kernel_gives_the_padded_features_for_several_layers(kernel, hf_models, tmp_path):
    st_dir = build_st(tmp_path / "st", hf_models["bert"], "mean")
    padded, _ = features(st_dir, TEXTS, "off", layers=(-1, -2, 0))
    packed, path = features(st_dir, TEXTS, "on", kernels=(kernel,), layers=(-1, -2, 0))
    assert path.packing and path.attention_kernel == kernel
    assert set(packed) == {"features", "features_layer-2", "features_layer0"}
    assert_same(packed, padded)


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_prompts_left_out_of_the_pooling_and_a_batch_of_one(arch, hf_models, tmp_path):
    st_dir = build_st(tmp_path / "st", hf_models[arch], ("mean", "cls"), include_prompt=False,
                      prompts={"query": "query one two :"})
    prompts = ["query one two :" if i % 2 else "" for i in range(len(TEXTS))]
    padded, _ = features(st_dir, TEXTS, "off", prompts=prompts, layers=(-1, -2))
    packed, path = features(st_dir, TEXTS, "on", prompts=prompts, layers=(-1, -2))
    assert path.packing
    assert_same(packed, padded)
    one_padded, _ = features(st_dir, TEXTS[:1], "off")
    one_packed, _ = features(st_dir, TEXTS[:1], "on")
    assert_same(one_packed, one_padded)


def test_packed_plan_fills_the_budget_and_resumes_exactly():
    rng = np.random.default_rng(0)
    n_tokens = rng.integers(1, 200, size=500).astype(np.int32)
    ids = [f"{i:04d}" for i in range(len(n_tokens))]
    order, batches = plan_batches(n_tokens, ids, 1000, 64, batch_overhead_tokens=1000, attention_width=192,
                                  packed=True)
    lengths = n_tokens[order]
    sums = [int(lengths[a:b].sum()) for a, b in batches]
    assert max(sums) <= 1000 and all(b - a <= 64 for a, b in batches)
    greedy, total, size = 0, None, 0  # the fewest batches: greedy filling (optimal for contiguous cuts)
    for length in lengths:
        if total is None or total + length > 1000 or size == 64:
            greedy, total, size = greedy + 1, 0, 0
        total, size = total + length, size + 1
    assert len(batches) == greedy
    assert [a for a, _ in batches] == sorted(a for a, _ in batches) and batches[-1][1] == len(ids)
    start = batches[3][0]  # a resumed run: the texts from a batch start on plan the same batches
    rest = order[start:]
    order2, batches2 = plan_batches(n_tokens[rest], [ids[i] for i in rest], 1000, 64, batch_overhead_tokens=1000,
                                    attention_width=192, packed=True)
    assert [(a + start, b + start) for a, b in batches2] == batches[3:]


def test_packing_is_not_a_fingerprint_part_and_the_summary_says_which_path_ran(tiny_model, tmp_path):
    texts = random_texts(30, seed=2)
    base = dict(model=tiny_model, dtype="float32", device="cpu", commit_seconds=0, batch_tokens=96)
    off = featurize_texts(FeaturizeConfig(**base, packing="off"), texts[:20], tmp_path / "store")
    on = featurize_texts(FeaturizeConfig(**base, packing="on"), texts, tmp_path / "store")  # same store
    assert off["packing"] == "off" and off["attention_kernel"] == "padded" and off["numerics"] == "fp32"
    assert on["packing"] == "on" and on["attention_kernel"] in CPU_KERNELS and on["n_encoded"] == 10
    assert on["padded_tokens"] == on["real_tokens"] and off["fingerprint"] == on["fingerprint"]
    assert {"tokenize_seconds", "encoder_tokens_per_s", "tokenize_tokens_per_s"} <= on.keys()
    store = FeatureStore.open(tmp_path / "store")
    reference = featurize_texts(FeaturizeConfig(**base, packing="off"), texts, tmp_path / "reference")
    other = FeatureStore.open(tmp_path / "reference")
    assert reference["n_encoded"] == 30
    a, b = store.features()[store.rows_for(text_ids(texts))], other.features()[other.rows_for(text_ids(texts))]
    assert np.abs(a - b).max() <= 1e-5


def test_the_cuda_bf16_weights_path_runs_packed_on_the_cpu_within_bf16_bounds(tiny_model):
    """What --device cuda does with auto precision and packing (weights held in bf16, packed batches,
    the probe in bf16), run on this CPU's tiny model: close to the fp32 padded features, not equal."""
    texts = random_texts(40, seed=4)
    config = FeaturizeConfig(model=tiny_model, dtype="float32", device="cpu", batch_tokens=128)
    encoder = load_encoder(tiny_model, "cpu", None)
    on_gpu = resolve(config, "cuda")  # as on a GPU box (the model stays on the CPU)
    path = prepare_encoder(encoder, on_gpu.numerics, on_gpu.packing)
    assert path.numerics == "bf16-weights" and path.packing and path.autocast == "fp32"
    assert str(next(encoder.model.parameters()).dtype) == "torch.bfloat16"
    got = np.zeros((len(texts), 32), dtype=np.float32)
    for idx, feats, _, batch in encode_in_plan_order(resolve(config), encoder, text_ids(texts), texts):
        assert batch.packed is not None
        got[idx] = feats["features"]
    reference, _ = features(tiny_model, texts, "off")
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    diff = np.abs(unit(got) - unit(reference["features"])).max()
    assert 0 < diff < 3e-2


def test_no_working_kernel_or_no_attention_setter_still_gives_the_padded_features(hf_models, tmp_path, monkeypatch):
    st_dir = build_st(tmp_path / "st", hf_models["bert"], "mean")
    padded, _ = features(st_dir, TEXTS, "off")
    fallback, path = features(st_dir, TEXTS, "on", kernels=("varlen_attn", "flash_attn"))  # CUDA-only kernels
    assert not path.packing and "no varlen attention kernel" in path.packing_reason
    assert_same(fallback, padded, tol=0.0)
    from transformers import PreTrainedModel

    def refuse(self, name, *args, **kwargs):
        raise ValueError("this transformers refuses registered names")

    monkeypatch.setattr(PreTrainedModel, "set_attn_implementation", refuse)
    packed, path = features(st_dir, TEXTS, "on")  # the config attribute instead
    assert path.packing
    assert_same(packed, padded)
