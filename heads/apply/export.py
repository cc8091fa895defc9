"""`cli export`: a head leaves headstore, as a sentence-transformers model or as plain safetensors.

`sentence-transformers`: a directory `SentenceTransformer(DIR)` loads with no `trust_remote_code`,
made of stock modules only, computing what `Pipeline.encode` computes:

    Transformer (the store's encoder, its max length) -> Pooling (the store's pooling)
    -> normaliser: Dense(diag(1/scale), -center/scale) for centring/standardising, Normalize for L2
    -> head: Dense layers (nn.Linear + a torch.nn activation)

A residual head f(x) = x + g(x) with a hidden layer carries x through the hidden Dense layers as the
extra rows [x; -x]: the activation a of relu and gelu satisfies a(x) - a(-x) = x (relu exactly; gelu
because Phi(x) + Phi(-x) = 1), so the next layer recovers x with weights [I, -I] and the last adds it
to g's output. A one-layer residual head is a Dense with `use_residual`. `similarity_fn_name` is the
head's energy: manhattan (L1), euclidean (L2) or cosine, so `model.similarity` ranks as the energy
does (similarity = -energy for L1/L2).
Not exportable exactly (refused, never approximated): tanh or layer-norm inside a residual head, a store array other
than the last layer, taps, a head mixing several layers. A float16 store rounds features to float16 before the head;
the exported model does not (differences ~1e-3 relative; a float32 store matches to ~1e-6).

A classifier head (`--loss ce`) exports the same way, its last module giving the class scores: a flat head's
last Dense outputs them; a head with one softmax per level of a label tree gets one more Dense, the 0/1 matrix
of each class's tree path, whose output is each class's summed level scores (the argmax `Head.predict` takes:
the summed log-softmaxes differ from it by a constant per text). `headstore_export.json` names the classes in
the order of the outputs (`classes`): `classes[model.encode(texts).argmax(-1)]` is the prediction from raw
text, with stock sentence-transformers and no headstore. (Chosen over a bare safetensors classifier because it
carries the encoder, pooling and normaliser too, so it takes text, not stored features; `--format
safetensors` still writes the head directory, whose `Head.predict` takes features.) `safetensors`: the head as a
directory `Head.load` reads (head, normaliser, config.json; its judgements and document memory where it has them).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from headstore.data.outputs import PARTIAL, begin_output, clear_partial, end_output
from headstore.data.files import atomic_write_json, writing
from headstore.featurize.encoder.adapters import has_adapters
from headstore.featurize.encoder.model import model_identity
from headstore.featurize.encoder.sentence import SentenceSpec
from headstore.featurize.store.layout import array_names
from headstore.heads.apply.pipeline import check_encoder, encoder_source
from headstore.heads.artefacts.head import Head
from headstore.heads.network.features import array_list
from headstore.heads.apply.formats import EXPORT_FORMATS
from headstore.heads.apply.export_beside import write_beside

# a classifier's outputs are class scores: no energy, cosine as a neutral default
SIMILARITY = {"l1": "manhattan", "l2": "euclidean", "cosine": "cosine", "classes": "cosine"}
EXACT_ODD_PART = ("relu", "gelu")  # a(x) - a(-x) = x: carry x through a hidden layer as [x; -x]


def _activation(name: str) -> torch.nn.Module:
    return {"relu": torch.nn.ReLU(), "gelu": torch.nn.GELU(), "tanh": torch.nn.Tanh(),
            "identity": torch.nn.Identity()}[name]


def _dense(weight: torch.Tensor, bias: torch.Tensor, activation: str, residual: bool = False):
    """A stock Dense computing activation(weight @ x + bias) (+ x); weight (out, in) as nn.Linear's."""
    from sentence_transformers.sentence_transformer.modules import Dense  # here: an optional extra

    out_f, in_f = weight.shape
    return Dense(in_f, out_f, bias=True, activation_function=_activation(activation),
                 init_weight=weight.detach().clone().float(), init_bias=bias.detach().clone().float(),
                 use_residual=residual)


def normalizer_modules(head: Head) -> list:
    """x -> (x - center) / scale, then L2 for the l2 kinds."""
    from sentence_transformers.sentence_transformer.modules import Normalize  # here: optional extra

    norm, modules = head.normalizer, []
    if norm.kind in ("center", "center-l2", "standardize"):
        modules.append(_dense(torch.diag(1.0 / norm.scale), -norm.center / norm.scale, "identity"))
    if norm.kind in ("l2", "center-l2"):
        modules.append(Normalize())
    return modules


def head_modules(head: Head) -> list:
    """The head's MLP as stock Dense (and LayerNorm) modules; ValueError where no exact form exists."""
    from sentence_transformers.sentence_transformer.modules import LayerNorm  # here: optional extra

    cfg, model = head.head_config, head.model
    layers = [(model.weights[i][0].T, model.biases[i][0]) for i in range(cfg.depth)]  # (out, in), (out,)
    act = cfg.activation
    if cfg.depth == 0:
        return []
    if cfg.residual and cfg.depth == 1:
        return [_dense(*layers[0], "identity", residual=True)]
    if not cfg.residual:
        modules = []
        for i, (w, b) in enumerate(layers):
            last = i == cfg.depth - 1
            if cfg.layer_norm and not last:
                modules.append(_dense(w, b, "identity"))
                ln = LayerNorm(w.shape[0])
                with torch.no_grad():
                    ln.norm.weight.copy_(model.ln_weights[i][0])
                    ln.norm.bias.copy_(model.ln_biases[i][0])
                modules += [ln, _dense(torch.eye(w.shape[0]), torch.zeros(w.shape[0]), act)]
            else:
                modules.append(_dense(w, b, "identity" if last else act))
        return modules
    if cfg.layer_norm:
        raise ValueError("a residual head with layer norm has no exact form in stock sentence-transformers "
                         "modules (the norm would also act on the carried input); export refused")
    if act not in EXACT_ODD_PART + ("identity",):
        raise ValueError(f"a residual head with activation {act!r} cannot carry its input through a hidden "
                         f"layer exactly (needs a(x) - a(-x) = x: {list(EXACT_ODD_PART)}, or identity); export refused")
    return _residual_modules(layers, act)


def _residual_layers(layers: list[tuple[torch.Tensor, torch.Tensor]], act: str) -> list[tuple]:
    """f(x) = x + g(x), depth >= 2, as (weight, bias, activation) layers: the hidden ones output [h; x; -x]
    (identity activation: [h; x])."""
    D = layers[0][0].shape[1]
    eye = torch.eye(D)
    carry_in = torch.cat([eye, -eye]) if act != "identity" else eye  # (C, D): x -> carried rows
    C = carry_in.shape[0]
    recover = torch.cat([eye, -eye], dim=1) if act != "identity" else eye  # (D, C): carried rows -> x
    out = []
    for i, (w, b) in enumerate(layers):
        last = i == len(layers) - 1
        if i == 0:
            weight = torch.cat([w, carry_in])  # (out + C, D)
        elif last:
            weight = torch.cat([w, recover], dim=1)  # (D, in + C)
        else:
            weight = torch.block_diag(w, carry_in @ recover)  # (out + C, in + C)
        bias = b if last else torch.cat([b, torch.zeros(C)])
        out.append((weight, bias, "identity" if last else act))
    return out


def _residual_modules(layers: list[tuple[torch.Tensor, torch.Tensor]], act: str) -> list:
    """f(x) = x + g(x), depth >= 2, as stock Dense modules (`_residual_layers`)."""
    return [_dense(*layer) for layer in _residual_layers(layers, act)]


def member_layers(head: Head) -> list[tuple]:
    """One ensemble member as plain (weight (out, in), bias, activation) layers; ValueError where none exist."""
    cfg, model = head.head_config, head.model
    layers = [(model.weights[i][0].T, model.biases[i][0]) for i in range(cfg.depth)]
    if cfg.layer_norm and cfg.depth > 1:
        raise ValueError(f"{head.source}: a head with layer norm cannot be merged into an ensemble's Dense layers; "
                         "export refused")
    if cfg.depth == 0:
        return []
    if cfg.residual and cfg.depth == 1:
        w, b = layers[0]
        return [(w + torch.eye(w.shape[0]), b, "identity")]
    if cfg.residual:
        if cfg.activation not in EXACT_ODD_PART + ("identity",):
            raise ValueError(f"{head.source}: a residual head with activation {cfg.activation!r} has no exact "
                             "Dense form; export refused")
        return _residual_layers(layers, cfg.activation)
    return [(w, b, "identity" if i == cfg.depth - 1 else cfg.activation) for i, (w, b) in enumerate(layers)]


def ensemble_modules(head) -> list:
    """An ensemble (heads.artefacts.head.EnsembleHead) as stock modules: the shared normaliser, then its members side by side as
    block matrices (first layer stacked, later layers block-diagonal), the last scaled by 1/K."""
    members = head.members
    first = members[0].normalizer
    for m in members[1:]:
        n = m.normalizer
        if n.kind != first.kind or not (torch.equal(n.center, first.center) and torch.equal(n.scale, first.scale)):
            raise ValueError(f"{head.source}: its heads use different feature normalisers ({m.source}: {n.kind} vs "
                             f"{first.kind}); a sentence-transformers stack has one; export refused (use --format "
                             "safetensors)")
    per_member = [member_layers(m) for m in members]
    depths = {len(layers) for layers in per_member}
    acts = {tuple(a for _, _, a in layers) for layers in per_member}
    if len(depths) > 1 or len(acts) > 1:
        raise ValueError(f"{head.source}: its heads differ in depth or activation; they cannot be merged into one "
                         "Dense stack; export refused (use --format safetensors)")
    K, depth = len(members), depths.pop()
    if depth == 0:  # every member the identity: K copies of x, / K
        D = members[0].in_dim
        return [*normalizer_modules(members[0]), _dense(torch.eye(D).repeat(K, 1) / K, torch.zeros(K * D), "identity")]
    modules = []
    for i in range(depth):
        ws = [layers[i][0] for layers in per_member]
        bs = [layers[i][1] for layers in per_member]
        weight = torch.cat(ws) if i == 0 else torch.block_diag(*ws)
        bias = torch.cat(bs)
        if i == depth - 1:
            weight, bias = weight / K, bias / K
        modules.append(_dense(weight, bias, per_member[0][i][2]))
    return [*normalizer_modules(members[0]), *modules]


def _exported_layer(head: Head, parts: dict) -> int:
    """The one encoder layer the head reads (a stock Transformer module gives one), or the one-line refusal."""
    if head.head_config.mix > 1 or len(array_list(head.array)) > 1:
        raise ValueError(f"{head.source} mixes several encoder layers ({head.array}); a sentence-transformers "
                         "Transformer module gives the last layer only; export refused (use --format safetensors "
                         "and headstore.Pipeline)")
    if head.array not in array_names(parts["layers"]):
        raise ValueError(f"{head.source} reads taps ({head.array}: featurize --taps), which no stock "
                         "sentence-transformers module gives; export refused (use --format safetensors and "
                         "headstore.Pipeline, which computes them)")
    return array_names(parts["layers"])[head.array]


def export_sentence_transformers(head: Head, out: Path, model: str | None = None) -> dict:
    """Write a SentenceTransformer directory at `out` (stock modules only); returns a summary."""
    try:  # here: sentence-transformers is an optional extra (headstore[export])
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.modules import Transformer
    except ImportError:
        raise ValueError("export to sentence-transformers needs it installed: pip install 'headstore[export]'") from None
    parts = head.store_manifest
    layer = _exported_layer(head, parts)
    name = encoder_source(head, model)
    check_encoder(head, name)
    model_dir = model_identity(name, int(parts["max_length"])).model_dir
    if has_adapters(model_dir):  # no stock sentence-transformers module runs a bottleneck adapter
        raise ValueError(f"{name}: carries bottleneck adapters, which plain sentence-transformers cannot run "
                         "(it would load the base weights alone); export refused (use --format safetensors and "
                         "headstore.Pipeline, or --setup lora, whose merged folder is a stock model)")
    transformer = Transformer(model_dir, max_seq_length=int(parts["max_length"]), do_lower_case=False)
    n_layers = transformer.auto_model.config.num_hidden_layers
    if layer not in (-1, n_layers):
        raise ValueError(f"{head.source} was trained on layer {layer} ({head.array}); a sentence-transformers "
                         "Transformer module gives the last layer only; export refused")
    body = ensemble_modules(head) if hasattr(head, "members") else [*normalizer_modules(head), *head_modules(head),
                                                                    *class_path_modules(head)]
    front = [transformer, *sentence_modules(SentenceSpec.from_parts(parts), model_dir,
                                            transformer.get_embedding_dimension())]
    modules = [query_document_router(front, body, document_modules(head))] if head.query_side else [*front, *body]
    prompts = {role: p for role, p in (parts.get("prompts") or {}).items() if p}  # encode(q, prompt_name="query")
    st = SentenceTransformer(modules=modules, device="cpu", similarity_fn_name=SIMILARITY[head.energy_name],
                             prompts=prompts)
    out.mkdir(parents=True, exist_ok=True)
    with writing(out):  # a full disk: one line naming the folder
        st.save(str(out), create_model_card=False)
    notes = []
    if parts.get("dtype") == "float16":
        notes.append("the store holds float16 features and the head was trained on them; the exported model "
                     "feeds float32 pooled features to the head (differences ~1e-3 relative)")
    if parts.get("precision") == "bf16":
        notes.append("the store was encoded under bf16 autocast; the exported model runs in float32")
    summary = {"format": "sentence-transformers", "out": str(out), "head": head.source, "encoder": name,
               "modules": [type(m).__name__ for m in modules],
               **({"routes": {"query": [type(m).__name__ for m in front + body],
                              "document": [type(m).__name__ for m in front + document_modules(head)]},
                   "encode": "a query-side head: encode_query(texts) / encode_document(texts); encode(texts) "
                             "takes the document route (the Router's default)"}
                  if head.query_side else {}), "similarity_fn_name": SIMILARITY[head.energy_name],
               "prompts": prompts,
               "embedding_dim": head.out_dim, "store_fingerprint": head.store_fingerprint, "notes": notes,
               **({"classes": head.classes, "embedding_dim": len(head.classes),
                   "outputs": "class scores: classes[encode(texts).argmax(-1)] is the prediction"}
                  if head.is_classifier else {}),
               "load": f"SentenceTransformer({str(out)!r})"}
    atomic_write_json(out / "headstore_export.json", {**summary, "head_config": head.config}, sort_keys=True)
    return summary


def class_path_modules(head: Head) -> list:
    """A classifier head with one softmax per tree level: a Dense summing each class's path through the levels
    (the 0/1 matrix (C, nodes)); nothing for a flat classifier (its outputs are the classes) or an energy head."""
    if not head.is_classifier or head.out_dim == len(head.classes):
        return []
    space = head.config["labels"]
    widths = [len(names) for names in space["nodes"]]
    offsets = torch.cumsum(torch.tensor([0] + widths[:-1]), 0)
    leaf = torch.as_tensor(space["leaf_nodes"], dtype=torch.long).reshape(len(space["classes"]), -1) + offsets
    path = torch.zeros(len(space["classes"]), sum(widths)).scatter_(1, leaf, 1.0)  # (C, L)
    return [_dense(path, torch.zeros(len(path)), "identity")]


def document_modules(head: Head) -> list:
    """What a query-side head does to documents: its normaliser only (an ensemble of query-side heads: the
    normalised features once per member, / K, as its energy needs); a head of both sides: the whole body."""
    members = getattr(head, "members", [head])
    if not all(m.query_side for m in members):
        raise ValueError(f"{head.source}: an ensemble mixing query-side heads and heads of both sides has no stock "
                         "sentence-transformers form; export refused (use --format safetensors)")
    if len(members) == 1:
        return normalizer_modules(head)
    K, D = len(members), members[0].in_dim
    return [*normalizer_modules(members[0]), _dense(torch.eye(D).repeat(K, 1) / K, torch.zeros(K * D), "identity")]


def query_document_router(front: list, query_body: list, document_body: list):
    """A query-side head as one stock Router: queries take the encoder, pooling and the head; documents the same
    encoder and pooling (the same module objects) and the normaliser only."""
    from sentence_transformers.sentence_transformer.modules import Router  # here: an optional extra

    return Router.for_query_document(query_modules=[*front, *query_body], document_modules=[*front, *document_body])


def sentence_modules(spec: SentenceSpec, model_dir: str, dim: int) -> list:
    """The store's sentence embedding as stock modules: Pooling (its modes, include_prompt), the model's Dense
    layers (loaded by sentence-transformers from the model directory, safetensors only), Normalize."""
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.sentence_transformer.modules import Pooling

    modes = spec.modes[0] if len(spec.modes) == 1 else spec.modes
    modules = [Pooling(dim, pooling_mode=modes, include_prompt=spec.include_prompt)]
    modules += [Dense.load(str(Path(model_dir) / d.path)) for d in spec.dense]
    return modules + ([Normalize()] if spec.normalize else [])


def export_safetensors(head: Head, out: Path, model: str | None = None) -> dict:
    """Write the head as a directory `Head.load` reads; `model` is recorded as its encoder when given."""
    if model and Path(model).is_dir():  # where its encoder is, for Pipeline.from_head
        head.config = {**head.config, "encoder_dir": str(Path(model).resolve())}
    head.save(out)
    return {"format": "safetensors", "out": str(out), "head": head.source,
            "files": sorted(p.name for p in out.iterdir() if p.name != PARTIAL), "load": f"headstore.Head.load({str(out)!r})"}


# the registry's writers (heads.apply.formats names them): writer(head, out dir, encoder override) -> summary
WRITERS: dict[str, Callable[[Head, Path, str | None], dict]] = {name: globals()[fn] for name, fn in EXPORT_FORMATS.items()}


def export_head(ref: str, fmt: str, out: str | Path, model: str | None = None) -> dict:
    """Export the head `ref` names (a train-head dir, or GRID#rank=K / GRID#id=HEAD_ID) in format `fmt`."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"export format {fmt!r}; valid: {sorted(EXPORT_FORMATS)}")
    out = Path(out)
    if out.exists() and not clear_partial(out, "export") and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out}: exists and is not an empty directory; give a new --out")
    head = Head.load(ref)
    existed = out.exists()
    out.mkdir(parents=True, exist_ok=True)
    begin_output(out, "export")  # an interrupted export (a full disk) is replaced by the same command's rerun
    try:
        summary = WRITERS[fmt](head, out, model)
    except ValueError:  # refused (no exact form, another layer, ...): nothing is left behind
        clear_partial(out, "export")
        end_output(out)
        if not existed:
            out.rmdir()
        raise
    notes = write_beside(head, ref, fmt, out)  # the memory, the lexical channel: what the model cannot carry
    if notes:
        summary.setdefault("notes", []).extend(notes)
    end_output(out)
    return summary
