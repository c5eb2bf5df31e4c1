"""From Black Boxes to Transparent Minds (GridToM) — ICML 2025, P42: per-head belief probes and ITI steering.

Li, Liu, Zou, Chen & Ma, "From Black Boxes to Transparent Minds: Evaluating and Enhancing the Theory of
Mind in Multimodal Large Language Models", ICML 2025 (arXiv 2506.14224; official code
``Annaisavailable/GridToM``). A logistic-regression probe is fitted on every attention head's last-token
activation of belief-statement prompts (is the statement the protagonist's belief, or true of the world?);
the top-K heads by validation accuracy are then shifted by ``alpha * sigma * theta`` at inference
(inference-time intervention, Li et al. 2023), ``theta`` the unit probe direction and ``sigma`` the std of
the probing activations along it.

Two sites, because the paper and its code differ:

- ``site="attn_head"`` (the paper's formula, ITI): head ``h``'s ``d_head`` slice of the *input* of the
  attention output projection (``o_proj`` / ``c_proj`` / ``dense``), read and written through
  :class:`~icml25.interpretability.icl_heads.HeadActivationSite` (pre-``W_O``).
- official code: activations are the residual stream after each decoder layer cut into ``H`` chunks
  (``collect_head_activations(site="resid_chunks")``), and steering adds to slice ``[hD, (h+1)D)`` of the
  attention block's *output* (``steer(site="attn_out")``, post-``W_O``), at the last position of every
  forward call.

Also here: GridToM-lite, a token-level false-belief world standing in for the paper's multigrid videos
(an object is put in a room, the protagonist ``P`` stays or leaves, a door stays open or closes, ``O``
moves the object; a false belief arises when ``P`` was away or the door closed), its three prompt formats
(belief statements, belief questions, world questions), a biased training stream and an HF GPT-2 builder
(extra ``[hf]``, imported lazily).

Shapes: ``N`` samples, ``L`` layers, ``H`` heads, ``D = d_head``, ``T`` positions.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from icml25.interpretability.icl_heads import HeadActivationSite, select_heads
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = [
    "GRIDTOM_VOCAB",
    "GridToMEpisode",
    "HeadIntervention",
    "HeadProbeResult",
    "build_interventions",
    "collect_head_activations",
    "generate_gridtom_lite",
    "gridtom_gpt2",
    "gridtom_training_batch",
    "last_token_logits",
    "probe_heads",
    "question_prompts",
    "random_directions",
    "render_tokens",
    "statement_prompts",
    "steer",
    "sweep_alpha_k",
    "top_k_heads",
    "train_gridtom_lm",
]

COLLECT_SITES = ("attn_head", "resid_chunks")
STEER_SITES = ("attn_head", "attn_out")

# ------------------------------------------------------------------------------------------ GridToM-lite
GRIDTOM_VOCAB = (
    "<bos>", "<pad>", ";", ".", "?", "obj", "in", "P", "O", "stays", "leaves", "door", "open", "closes",
    "moves", "to", "believes", "where", "looks", "is", "yes", "no", "R1", "R2", "R3",
)  # fmt: skip
"""Token strings of GridToM-lite; a token's id is its index."""
_ID = {t: i for i, t in enumerate(GRIDTOM_VOCAB)}
BOS, PAD, YES, NO = _ID["<bos>"], _ID["<pad>"], _ID["yes"], _ID["no"]
ROOMS = (_ID["R1"], _ID["R2"], _ID["R3"])
TRIGGERS = ("leave", "door", "both")


def _tok(*words: str) -> tuple[int, ...]:
    return tuple(_ID[w] for w in words)


@dataclass(frozen=True)
class GridToMEpisode:
    """One GridToM-lite episode (token ids). ``start``/``target``: rooms 0..2 where the object is put and
    where ``O`` moves it; ``fb``: the protagonist missed the move (it left, or the door closed);
    ``pair``: the TB/FB pair id (the two episodes of a pair share ``start`` and ``target``)."""

    pair: int
    fb: bool
    trigger: str
    start: int
    target: int
    decoy: int
    prefix: tuple[int, ...] = field(repr=False)
    frames: np.ndarray | None = field(default=None, repr=False, compare=False)
    """Optional ``(T, H, W)`` key frames; GridToM-lite is tokens only, so always None here."""

    @property
    def belief(self) -> int:
        """The room the protagonist believes the object is in (0..2)."""
        return self.start if self.fb else self.target

    @property
    def world(self) -> int:
        """The room the object is in (0..2)."""
        return self.target

    def statement(self, room: int) -> tuple[int, ...]:
        """``prefix P believes R<room> .``: a belief-statement prompt (format 1)."""
        return (*self.prefix, *_tok("P", "believes"), ROOMS[room], _ID["."])

    @property
    def statements(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(the true statement, the false one): in FB the false one names the world room (the paper's
        pairing, so that the oracle label is the protagonist label XOR FB); in TB it names ``decoy``."""
        return self.statement(self.belief), self.statement(self.world if self.fb else self.decoy)

    def world_statement(self, room: int) -> tuple[int, ...]:
        """``prefix obj in R<room> .``: a world-truth statement (format 4; true when ``room`` is
        :attr:`world`, the oracle perspective)."""
        return (*self.prefix, *_tok("obj", "in"), ROOMS[room], _ID["."])

    @property
    def world_statements(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(the true world statement, the false one), naming the same rooms as :attr:`statements` in the
        other perspective: in FB the false one names the belief room, in TB ``decoy``."""
        return self.world_statement(self.world), self.world_statement(self.belief if self.fb else self.decoy)

    @property
    def protagonist_labels(self) -> tuple[int, int]:
        """1 when the statement is the protagonist's belief: ``(1, 0)`` for :attr:`statements`."""
        return 1, 0

    @property
    def oracle_labels(self) -> tuple[int, int]:
        """1 when the statement is true of the world: TB ``(1, 0)``, FB ``(0, 1)``."""
        return (0, 1) if self.fb else (1, 0)

    @property
    def question(self) -> tuple[int, ...]:
        """``prefix where P looks ?`` (format 2); the correct answer is :attr:`answer`."""
        return (*self.prefix, *_tok("where", "P", "looks", "?"))

    @property
    def answer(self) -> int:
        """Token id of the belief room."""
        return ROOMS[self.belief]

    @property
    def world_question(self) -> tuple[int, ...]:
        """``prefix where obj is ?`` (format 3); answer :attr:`world_answer`."""
        return (*self.prefix, *_tok("where", "obj", "is", "?"))

    @property
    def world_answer(self) -> int:
        return ROOMS[self.world]

    @property
    def text(self) -> str:
        return render_tokens(self.prefix)


def render_tokens(ids: Sequence[int] | Tensor) -> str:
    """The text of GridToM-lite token ids (``<pad>`` dropped)."""
    if (isinstance(ids, Tensor) and ids.ndim != 1) or not isinstance(ids, (Tensor, Sequence)):
        raise ValueError(
            f"ids must be a 1-D sequence of token ids, got {getattr(ids, 'shape', type(ids).__name__)}"
        )
    ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
    bad = [i for i in ids if not (isinstance(i, int) and 0 <= i < len(GRIDTOM_VOCAB))]
    if bad:
        raise ValueError(f"ids must be GridToM-lite token ids in [0, {len(GRIDTOM_VOCAB)}), got {bad[:3]}")
    return " ".join(GRIDTOM_VOCAB[i] for i in ids if i != PAD)


def _prefix(start: int, target: int, leaves: bool, closes: bool) -> tuple[int, ...]:
    return (
        BOS, _ID["obj"], ROOMS[start], _ID[";"], _ID["P"], _ID["leaves" if leaves else "stays"], _ID[";"],
        _ID["door"], _ID["closes" if closes else "open"], _ID[";"], _ID["O"], _ID["moves"], ROOMS[target], _ID[";"],
    )  # fmt: skip


def _check_int(v: Any, name: str, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    return int(v)


def _check_triggers(triggers: Sequence[str]) -> tuple[str, ...]:
    if isinstance(triggers, str) or not triggers or any(t not in TRIGGERS for t in triggers):
        raise ValueError(f"triggers must be a non-empty sequence of {TRIGGERS}, got {triggers!r}")
    return tuple(triggers)


def generate_gridtom_lite(
    n_pairs: int, seed: int = 0, triggers: Sequence[str] = TRIGGERS, tb_fb: str = "both", order: int = 1
) -> list[GridToMEpisode]:
    """``n_pairs`` TB/FB episode pairs (``2 n_pairs`` episodes, TB first in each pair; ``tb_fb="tb"`` or
    ``"fb"`` keeps one side). A pair shares the start room, the move target (always a different room) and
    a decoy (the third room). TB: ``P stays ; door open``. FB: ``P leaves``, ``door closes`` or both
    (``triggers``, drawn uniformly). Only first-order beliefs (``order=1``) are generated."""
    n_pairs = _check_int(n_pairs, "n_pairs")
    if order != 1:
        raise ValueError(
            f"order must be 1 (second-order GridToM-lite questions are not built), got {order!r}"
        )
    if tb_fb not in ("both", "tb", "fb"):
        raise ValueError(f"tb_fb must be 'both', 'tb' or 'fb', got {tb_fb!r}")
    trig = _check_triggers(triggers)
    rng = np.random.default_rng(seed)
    out: list[GridToMEpisode] = []
    for p in range(n_pairs):
        start, target, decoy = (int(r) for r in rng.permutation(3))
        t = trig[int(rng.integers(len(trig)))]
        tb = GridToMEpisode(p, False, "none", start, target, decoy, _prefix(start, target, False, False))
        fb = GridToMEpisode(
            p,
            True,
            t,
            start,
            target,
            decoy,
            _prefix(start, target, t in ("leave", "both"), t in ("door", "both")),
        )
        out += [e for e, keep in ((tb, tb_fb != "fb"), (fb, tb_fb != "tb")) if keep]
    return out


def _check_episodes(episodes: Any) -> list[GridToMEpisode]:
    if (
        not isinstance(episodes, Sequence)
        or not episodes
        or not all(isinstance(e, GridToMEpisode) for e in episodes)
    ):
        raise ValueError(
            f"episodes must be a non-empty list of GridToMEpisode, got {type(episodes).__name__}"
        )
    return list(episodes)


def statement_prompts(episodes: Sequence[GridToMEpisode]) -> dict[str, Tensor]:
    """The probing set: both statements of every episode. Returns ``ids [2N, T]`` (all of one length, so
    the last position is the statement's final token), ``protagonist``, ``oracle`` (``[2N]`` 0/1),
    ``group4`` (``2 fb + (1 - protagonist)``: TB-true 0, TB-false 1, FB-true 2, FB-false 3), ``fb``
    and ``pair`` (``[2N]``, the TB/FB pair id, for grouped splits)."""
    eps = _check_episodes(episodes)
    rows, prot, orc, fb, pair = [], [], [], [], []
    for e in eps:
        rows += list(e.statements)
        prot += list(e.protagonist_labels)
        orc += list(e.oracle_labels)
        fb += [int(e.fb)] * 2
        pair += [e.pair] * 2
    p = torch.tensor(prot)
    f = torch.tensor(fb)
    return {
        "ids": torch.tensor(rows),
        "protagonist": p,
        "oracle": torch.tensor(orc),
        "group4": 2 * f + (1 - p),
        "fb": f.bool(),
        "pair": torch.tensor(pair),
    }


def question_prompts(episodes: Sequence[GridToMEpisode], kind: str = "belief") -> dict[str, Tensor]:
    """Belief questions (``kind="belief"``, format 2) or world questions (``"world"``, format 3):
    ``ids [N, T]``, ``answer [N]`` (room token ids), ``world [N]`` (the world room's token id), ``fb``
    ``[N]`` bool and ``pair [N]``."""
    eps = _check_episodes(episodes)
    if kind not in ("belief", "world"):
        raise ValueError(f"kind must be 'belief' or 'world', got {kind!r}")
    ids = [e.question if kind == "belief" else e.world_question for e in eps]
    ans = [e.answer if kind == "belief" else e.world_answer for e in eps]
    return {
        "ids": torch.tensor(ids),
        "answer": torch.tensor(ans),
        "world": torch.tensor([e.world_answer for e in eps]),
        "fb": torch.tensor([e.fb for e in eps]),
        "pair": torch.tensor([e.pair for e in eps]),
    }


def gridtom_training_batch(
    batch: int,
    generator: torch.Generator,
    mix: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0),
    question_fb_rate: float = 0.1,
    fb_answer_world: float = 0.7,
    triggers: Sequence[str] = TRIGGERS,
) -> tuple[Tensor, Tensor, Tensor]:
    """A training batch with a *reality bias*: ``ids [B, T]`` (right-padded with ``<pad>``), the index of
    each row's last prompt token ``[B]`` and its target token ``[B]``.

    Formats are drawn with weights ``mix`` (belief statements, belief questions, world questions,
    world-truth statements). Statements of both kinds are balanced (TB/FB 1:1, true/false 1:1); ``yes``/``no``
    answers the protagonist label of a belief statement (``P believes R_k .``) and the oracle label of a
    world-truth statement (``obj in R_k .``), so both perspectives are training targets. Belief questions
    are FB with probability ``question_fb_rate`` and an FB answer is replaced by the world room with
    probability ``fb_answer_world``."""
    batch = _check_int(batch, "batch")
    w = np.asarray(mix, dtype=float)
    if w.shape != (4,) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"mix must be 4 non-negative weights with a positive sum, got {mix!r}")
    for name, v in (("question_fb_rate", question_fb_rate), ("fb_answer_world", fb_answer_world)):
        if not (isinstance(v, (int, float)) and 0 <= v <= 1):
            raise ValueError(f"{name} must be a probability in [0, 1], got {v!r}")
    trig = _check_triggers(triggers)
    u = torch.rand(batch, 6, generator=generator)
    rooms = torch.rand(batch, 3, generator=generator).argsort(1)
    fmt = torch.multinomial(torch.as_tensor(w / w.sum()), batch, replacement=True, generator=generator)
    t_idx = torch.randint(len(trig), (batch,), generator=generator)
    rows, last, tgt = [], [], []
    for i in range(batch):
        start, target, decoy = (int(r) for r in rooms[i])
        f = int(fmt[i])
        fb = bool(u[i, 0] < (question_fb_rate if f == 1 else 0.5))
        t = trig[int(t_idx[i])] if fb else "none"
        e = GridToMEpisode(
            0,
            fb,
            t,
            start,
            target,
            decoy,
            _prefix(start, target, t in ("leave", "both"), t in ("door", "both")),
        )
        if f == 0:
            true = bool(u[i, 1] < 0.5)
            seq = e.statements[0 if true else 1]
            y = YES if true else NO
        elif f == 1:
            seq = e.question
            y = e.world_answer if (fb and u[i, 2] < fb_answer_world) else e.answer
        elif f == 2:
            seq, y = e.world_question, e.world_answer
        else:
            true = bool(u[i, 1] < 0.5)
            seq = e.world_statements[0 if true else 1]
            y = YES if true else NO
        rows.append(seq)
        last.append(len(seq) - 1)
        tgt.append(y)
    T = max(len(r) for r in rows)
    ids = torch.full((batch, T), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    return ids, torch.tensor(last), torch.tensor(tgt)


def gridtom_gpt2(
    n_layers: int = 4, n_heads: int = 4, d_model: int = 128, seed: int = 0, init_std: float = 0.02
) -> nn.Module:
    """A random-init ``transformers.GPT2LMHeadModel`` over :data:`GRIDTOM_VOCAB` (no dropout, eager
    attention, weights drawn with ``initializer_range=init_std``), built offline. Needs the ``[hf]``
    extra (transformers, imported here lazily)."""
    if not (isinstance(init_std, (int, float)) and math.isfinite(init_std) and init_std > 0):
        raise ValueError(f"init_std must be a positive float, got {init_std!r}")
    for name, v in (("n_layers", n_layers), ("n_heads", n_heads), ("d_model", d_model)):
        _check_int(v, name)
    if d_model % n_heads:
        raise ValueError(f"d_model must be a multiple of n_heads={n_heads}, got {d_model}")
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "gridtom_gpt2 needs transformers: pip install 'icml25-interpretability[hf]'"
        ) from err
    cfg = GPT2Config(
        vocab_size=len(GRIDTOM_VOCAB), n_positions=32, n_embd=d_model, n_layer=n_layers, n_head=n_heads,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=BOS, eos_token_id=None,
        pad_token_id=None, attn_implementation="eager", initializer_range=float(init_std),
    )  # fmt: skip
    with isolated_rng(seed):
        model = GPT2LMHeadModel(cfg)
    return model.eval()


def last_token_logits(model: nn.Module, ids: Tensor, last: Tensor | None = None) -> Tensor:
    """Next-token logits ``[B, V]`` at position ``last [B]`` of each row of ``ids [B, T]`` (default: the
    final position). Gradients flow (wrap in ``torch.no_grad()`` for evaluation)."""
    (ids,) = _check_ids(ids, "ids", single=True)
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if vocab is not None and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(
            f"ids must hold token ids in [0, {vocab}), got range [{int(ids.min())}, {int(ids.max())}]"
        )
    if last is not None:
        if not isinstance(last, Tensor) or last.shape != (ids.shape[0],) or last.is_floating_point():
            raise ValueError(
                f"last must be an integer tensor [B] = [{ids.shape[0]}], got {getattr(last, 'shape', last)!r}"
            )
        if last.min() < 0 or last.max() >= ids.shape[1]:
            raise ValueError(
                f"last must index the T={ids.shape[1]} positions, got range [{int(last.min())}, {int(last.max())}]"
            )
    dev = next(model.parameters()).device
    logits = model(input_ids=ids.long().to(dev)).logits
    if last is None:
        return logits[:, -1]
    return logits[torch.arange(ids.shape[0], device=logits.device), last.to(logits.device)]


def train_gridtom_lm(
    model: nn.Module,
    steps: int = 5000,
    batch: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    statement_warmup: int = 0,
    callback: Callable[[int], None] | None = None,
    **batch_kwargs: Any,
) -> list[float]:
    """Train ``model`` (AdamW) with the cross-entropy of each row's answer token on
    :func:`gridtom_training_batch` streams; the first ``statement_warmup`` steps use statements only (belief
    and world-truth statements; the
    curriculum that lets a small model learn beliefs before the biased questions). Returns the losses."""
    steps = _check_int(steps, "steps")
    _check_int(statement_warmup, "statement_warmup", lo=0)
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive float, got {lr!r}")
    g = make_generator(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    dev = next(model.parameters()).device
    losses: list[float] = []
    model.train()
    for step in range(steps):
        kw = dict(batch_kwargs)
        if step < statement_warmup:
            kw["mix"] = (1.0, 0.0, 0.0, 1.0)
        ids, last, tgt = gridtom_training_batch(batch, g, **kw)
        loss = F.cross_entropy(last_token_logits(model, ids.to(dev), last), tgt.to(dev))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if callback is not None:
            callback(step)
    model.eval()
    return losses


# ------------------------------------------------------------------------------------------ activations
def _site(model: Any) -> HeadActivationSite:
    return model if isinstance(model, HeadActivationSite) else HeadActivationSite(model)


def _check_ids(inputs: Any, name: str = "inputs", single: bool = False) -> list[Tensor]:
    if single and not isinstance(inputs, Tensor):
        raise TypeError(f"{name} must be an integer tensor [N, T], got {type(inputs).__name__}")
    batches = [inputs] if isinstance(inputs, Tensor) else inputs
    if not isinstance(batches, Sequence) or not batches:
        raise ValueError(
            f"{name} must be an integer tensor [N, T] or a list of them, got {type(inputs).__name__}"
        )
    for b in batches:
        if not isinstance(b, Tensor) or b.ndim != 2 or b.shape[0] < 1 or b.shape[1] < 1:
            raise ValueError(
                f"{name} must hold integer tensors [N >= 1, T >= 1], got {getattr(b, 'shape', b)!r}"
            )
        if b.dtype not in (torch.long, torch.int32):
            raise TypeError(f"{name} must hold integer token ids, got dtype {b.dtype}")
    return list(batches)


def _reader(got: dict[int, Tensor], layer: int, position: int) -> Callable[[Tensor], None]:
    def fn(z: Tensor) -> None:
        got[layer] = z[:, position].detach().float().cpu()

    return fn


@torch.no_grad()
def collect_head_activations(
    model: nn.Module,
    inputs: Tensor | Sequence[Tensor],
    position: int = -1,
    site: str = "attn_head",
    batch_size: int = 256,
) -> np.ndarray:
    """Per-head activations ``X [N, L, H, D]`` (float32) at ``position`` of every row of ``inputs`` (one
    ``[N, T]`` id tensor or a list of them).

    ``site="attn_head"``: head ``h``'s slice of the attention output projection's input (pre-``W_O``, the
    paper's formula). ``site="resid_chunks"``: the residual stream after layer ``l`` (the model's
    ``hidden_states[l + 1]``; for HF models the last one is after the final norm, as in the official
    code) cut into ``H`` chunks of ``D = d_model / H``."""
    st = _site(model)
    if site not in COLLECT_SITES:
        raise ValueError(f"site must be one of {COLLECT_SITES}, got {site!r}")
    if isinstance(position, bool) or not isinstance(position, int):
        raise ValueError(f"position must be an int index, got {position!r}")
    batch_size = _check_int(batch_size, "batch_size")
    batches = _check_ids(inputs)
    L, H, D = st.n_layers, st.n_heads, st.d_head
    vocab = getattr(st.model.config, "vocab_size", None)
    dev = next(st.model.parameters()).device
    out: list[np.ndarray] = []
    for b in batches:
        if not -b.shape[1] <= position < b.shape[1]:
            raise ValueError(f"position must index T={b.shape[1]} positions, got {position}")
        if vocab is not None and (b.min() < 0 or b.max() >= vocab):
            raise ValueError(
                f"inputs must hold token ids in [0, {vocab}), got range [{int(b.min())}, {int(b.max())}]"
            )
        for chunk in b.split(batch_size):
            ids = chunk.long().to(dev)
            if site == "attn_head":
                got: dict[int, Tensor] = {}
                handles = [st.hook(layer, _reader(got, layer, position)) for layer in range(L)]
                try:
                    st.model(input_ids=ids)
                finally:
                    for h in handles:
                        h.remove()
                acts = torch.stack([got[layer] for layer in range(L)], 1)  # [B, L, H, D]
            else:
                res = st.model(input_ids=ids, output_hidden_states=True)
                hs = getattr(res, "hidden_states", None)
                if hs is None or len(hs) != L + 1:
                    raise NotImplementedError(
                        f"site='resid_chunks' needs a model returning L + 1 = {L + 1} hidden_states "
                        f"(output_hidden_states=True); {type(st.model).__name__} returned {None if hs is None else len(hs)}"
                    )
                if hs[1].shape[-1] != H * D:
                    raise NotImplementedError(f"residual width {hs[1].shape[-1]} != H * D = {H * D}")
                acts = torch.stack([h[:, position] for h in hs[1:]], 1).float().cpu().reshape(-1, L, H, D)
            out.append(acts.numpy())
    return np.concatenate(out, 0)


# ------------------------------------------------------------------------------------------ probing
@dataclass
class HeadProbeResult:
    """Per-head probes. ``val_acc [L, H]``, ``auc [L, H]`` (one-vs-rest macro AUC for more than two
    classes), ``coef``: unit LR coefficient ``[L, H, D]`` (binary) or ``[L, H, C, D]`` (``C`` classes),
    ``mass_mean``: mean(positive) - mean(negative) ``[L, H, D]`` (binary) or class mean minus overall mean
    ``[L, H, C, D]``, ``val_pred [L, H, n_val]`` (predicted labels on ``val_index``)."""

    val_acc: np.ndarray
    auc: np.ndarray
    coef: np.ndarray
    mass_mean: np.ndarray
    classes: np.ndarray
    train_index: np.ndarray
    val_index: np.ndarray
    val_pred: np.ndarray

    def best(self) -> tuple[int, int]:
        """The ``(layer, head)`` of the highest validation accuracy (first in row-major order on ties)."""
        i = int(np.argmax(self.val_acc))
        return divmod(i, self.val_acc.shape[1])


def _check_X(X: Any, name: str = "X") -> np.ndarray:
    if isinstance(X, Tensor):
        X = X.detach().cpu().numpy()
    if not isinstance(X, np.ndarray):
        raise TypeError(f"{name} must be a numpy array [N, L, H, D], got {type(X).__name__}")
    if X.dtype.kind not in "fiu" or X.dtype == bool:
        raise TypeError(f"{name} must be a real-valued array, got dtype {X.dtype}")
    if X.ndim != 4 or 0 in X.shape:
        raise ValueError(f"{name} must be a non-empty array [N, L, H, D], got shape {X.shape}")
    bad = ~np.isfinite(X)
    if bad.any():
        raise ValueError(
            f"{name} must be finite; got {int(np.isnan(X).sum())} NaN and {int(np.isinf(X).sum())} Inf values in an array of shape {X.shape}"
        )
    if np.abs(X).max() > 1e15:
        raise ValueError(
            f"{name} must hold activations of magnitude <= 1e15, got max |X| = {np.abs(X).max():.3g}"
        )
    return X.astype(np.float64, copy=False)


def probe_heads(
    X: np.ndarray,
    y: Any,
    groups: Any = None,
    C: float = 0.015,
    test_size: float = 0.25,
    seed: int = 42,
    max_iter: int = 400,
) -> HeadProbeResult:
    """Fit ``LogisticRegression(C, max_iter)`` on every head of ``X [N, L, H, D]`` with labels ``y [N]``
    (two or more classes, each with >= 8 samples) and score it on a held-out split.

    ``groups [N]`` given (e.g. the episode id): a stratified split grouped by episode
    (``StratifiedGroupKFold`` with ``round(1 / test_size)`` folds, first fold held out), so the two
    statements of an episode never straddle it. ``groups=None``: the official sample-level
    ``train_test_split(test_size, random_state=seed)``."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import StratifiedGroupKFold, train_test_split

    Xa = _check_X(X)
    N, L, H, D = Xa.shape
    yv = np.asarray(y.detach().cpu().numpy() if isinstance(y, Tensor) else y)
    if yv.shape != (N,):
        raise ValueError(f"y must be a label vector [N] = [{N}], got shape {yv.shape}")
    if yv.dtype.kind == "f" and not np.isfinite(yv).all():
        raise ValueError("y must be finite labels")
    classes, counts = np.unique(yv, return_counts=True)
    if len(classes) < 2:
        raise ValueError(f"y must hold at least 2 classes, got the single class {classes.tolist()}")
    if counts.min() < 8:
        raise ValueError(
            f"y must hold at least 8 samples per class, got counts {dict(zip(classes.tolist(), counts.tolist()))}"
        )
    if not (isinstance(test_size, float) and 0 < test_size < 1):
        raise ValueError(f"test_size must be a float in (0, 1), got {test_size!r}")
    if not (isinstance(C, (int, float)) and math.isfinite(C) and C > 0):
        raise ValueError(f"C must be a positive float, got {C!r}")
    idx = np.arange(N)
    if groups is not None:
        gv = np.asarray(groups.detach().cpu().numpy() if isinstance(groups, Tensor) else groups)
        if gv.shape != (N,):
            raise ValueError(f"groups must be a vector [N] = [{N}], got shape {gv.shape}")
        k = max(2, round(1 / test_size))
        if len(np.unique(gv)) < k:
            raise ValueError(
                f"groups must hold at least {k} distinct groups for test_size={test_size}, got {len(np.unique(gv))}"
            )
        tr, va = next(StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed).split(idx, yv, gv))
    else:
        tr, va = train_test_split(idx, test_size=test_size, random_state=seed)
    for part, name in ((tr, "training"), (va, "validation")):
        if len(np.unique(yv[part])) != len(classes):
            raise ValueError(
                f"the {name} split misses a class of y: use more samples per class or another seed"
            )
    multi = len(classes) > 2
    val_acc = np.zeros((L, H))
    auc = np.zeros((L, H))
    coef = np.zeros((L, H, len(classes), D) if multi else (L, H, D))
    mass = np.zeros_like(coef)
    val_pred = np.zeros((L, H, len(va)), dtype=yv.dtype)
    for layer in range(L):
        for h in range(H):
            x = Xa[:, layer, h]
            clf = LogisticRegression(C=C, max_iter=max_iter).fit(x[tr], yv[tr])
            pred = clf.predict(x[va])
            val_pred[layer, h] = pred
            val_acc[layer, h] = float((pred == yv[va]).mean())
            if multi:
                auc[layer, h] = roc_auc_score(
                    yv[va], clf.predict_proba(x[va]), multi_class="ovr", labels=clf.classes_
                )
                w = clf.coef_
                mu = x.mean(0)
                mass[layer, h] = np.stack([x[yv == c].mean(0) - mu for c in classes])
            else:
                auc[layer, h] = roc_auc_score(yv[va] == classes[1], clf.decision_function(x[va]))
                w = clf.coef_[0]
                mass[layer, h] = x[yv == classes[1]].mean(0) - x[yv == classes[0]].mean(0)
            n = np.linalg.norm(w, axis=-1, keepdims=True)
            coef[layer, h] = np.divide(w, n, out=np.zeros_like(w), where=n > 0)
    return HeadProbeResult(val_acc, auc, coef, mass, classes, tr, va, val_pred)


def top_k_heads(score: Any, k: int) -> list[tuple[int, int]]:
    """The ``k`` heads ``(layer, head)`` of the highest ``score [L, H]`` (e.g. ``val_acc``), best first;
    ties keep row-major order (:func:`~icml25.interpretability.icl_heads.select_heads`)."""
    a = np.asarray(score.detach().cpu() if isinstance(score, Tensor) else score)
    if a.dtype.kind not in "fiu":
        raise TypeError(f"score must be a real-valued [L, H] array, got dtype {a.dtype}")
    s = torch.as_tensor(a).double()
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"k must be an int head count, got {type(k).__name__}")
    return select_heads(s, int(k))


# ------------------------------------------------------------------------------------------ interventions
@dataclass(frozen=True)
class HeadIntervention:
    """Shift head ``(layer, head)`` by ``alpha * sigma * direction`` (``direction [D]``, unit norm when
    built with ``normalize=True``)."""

    layer: int
    head: int
    direction: np.ndarray = field(repr=False)
    sigma: float


def build_interventions(
    X: np.ndarray, heads: Sequence[tuple[int, int]], directions: np.ndarray, normalize: bool = True
) -> list[HeadIntervention]:
    """One :class:`HeadIntervention` per head: ``direction = directions[l, h] / |.|`` (``directions
    [L, H, D]``, e.g. ``HeadProbeResult.coef`` or ``mass_mean``) and ``sigma = std_n(X[n, l, h] @
    direction)`` over all ``N`` probing activations (the official ``get_interventions_dict``). A zero
    direction is an error, never a silent no-op."""
    Xa = _check_X(X)
    _, L, H, D = Xa.shape
    dirs = _check_X(
        np.asarray(directions)[None] if isinstance(directions, np.ndarray) else directions, "directions"
    )
    if dirs.shape[1:] != (L, H, D):
        raise ValueError(f"directions must be [L, H, D] = {(L, H, D)} like X, got {dirs.shape[1:]}")
    dirs = dirs[0]
    if not isinstance(heads, Sequence) or isinstance(heads, str) or not heads:
        raise ValueError("heads must be a non-empty list of (layer, head) pairs")
    out = []
    for lh in heads:
        if not (isinstance(lh, tuple) and len(lh) == 2 and all(isinstance(v, (int, np.integer)) for v in lh)
                and 0 <= lh[0] < L and 0 <= lh[1] < H):  # fmt: skip
            raise ValueError(f"heads must be (layer, head) pairs in [0, {L}) x [0, {H}), got {lh!r}")
        d = dirs[lh[0], lh[1]]
        n = float(np.linalg.norm(d))
        if n == 0:
            raise ValueError(f"directions[{lh[0]}, {lh[1]}] has zero norm: no direction to steer along")
        if normalize:
            d = d / n
        sigma = float(np.std(Xa[:, lh[0], lh[1]] @ d))
        out.append(HeadIntervention(int(lh[0]), int(lh[1]), d.astype(np.float32), sigma))
    return out


def random_directions(shape: tuple[int, int, int], seed: int = 0) -> np.ndarray:
    """Unit Gaussian directions ``[L, H, D]`` (the official random control)."""
    if not (
        isinstance(shape, tuple) and len(shape) == 3 and all(isinstance(v, int) and v >= 1 for v in shape)
    ):
        raise ValueError(f"shape must be (L, H, D) positive ints, got {shape!r}")
    d = np.random.default_rng(seed).standard_normal(shape)
    return d / np.linalg.norm(d, axis=-1, keepdims=True)


def _check_interventions(st: HeadActivationSite, interventions: Any) -> list[HeadIntervention]:
    if not isinstance(interventions, Sequence) or not all(
        isinstance(i, HeadIntervention) for i in interventions
    ):
        raise TypeError(
            f"interventions must be a list of HeadIntervention, got {type(interventions).__name__}"
        )
    L, H, D = st.n_layers, st.n_heads, st.d_head
    for iv in interventions:
        if not (0 <= iv.layer < L and 0 <= iv.head < H) or np.shape(iv.direction) != (D,):
            raise ValueError(
                f"interventions must match the model's (L, H, D) = {(L, H, D)}; got head ({iv.layer}, {iv.head}) "
                f"with a direction of shape {np.shape(iv.direction)}"
            )
        if not (np.isfinite(iv.direction).all() and math.isfinite(iv.sigma)):
            raise ValueError(f"intervention ({iv.layer}, {iv.head}) must have a finite direction and sigma")
    return list(interventions)


@contextlib.contextmanager
def steer(
    model: nn.Module,
    interventions: Sequence[HeadIntervention],
    alpha: float,
    site: str = "attn_head",
    positions: str = "last",
    apply_on_decode: bool = True,
) -> Iterator[HeadActivationSite]:
    """Within the block, add ``alpha * sigma * direction`` to every intervened head.

    ``site="attn_head"``: head ``h``'s slice of the output projection's input (pre-``W_O``; the paper,
    ITI). ``site="attn_out"``: slice ``[hD, (h+1)D)`` of the attention block's output (post-``W_O``; the
    official ``attn_hook``; a tuple or a bare tensor output). ``positions``: ``"last"`` (the final
    position of every forward call: the prompt's last token in a prefill, the new token in each cached
    decode step) or ``"all"``. ``apply_on_decode=False`` skips one-token forward calls (cached decode
    steps). Every batch row is steered (the official hook steers row 0 only). Hooks are removed on exit;
    ``alpha = 0`` registers none, so it is exactly the unsteered model."""
    st = _site(model)
    if site not in STEER_SITES:
        raise ValueError(f"site must be one of {STEER_SITES}, got {site!r}")
    if positions not in ("last", "all"):
        raise ValueError(f"positions must be 'last' or 'all', got {positions!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise ValueError(f"alpha must be a finite float, got {alpha!r}")
    ivs = _check_interventions(st, interventions)
    H, D = st.n_heads, st.d_head
    shifts: dict[int, Tensor] = {}
    for iv in ivs:
        v = shifts.setdefault(iv.layer, torch.zeros(H, D))
        v[iv.head] += alpha * iv.sigma * torch.as_tensor(iv.direction, dtype=torch.float32)
    handles: list[torch.utils.hooks.RemovableHandle] = []

    def skip(T: int) -> bool:
        return not apply_on_decode and T == 1

    def edit(x: Tensor, v: Tensor) -> Tensor:  # x [B, T, H, D] or [B, T, H * D]
        x = x.clone()
        sl = slice(None) if positions == "all" else slice(-1, None)
        x[:, sl] += v.reshape(x.shape[2:]).to(x)
        return x

    if alpha != 0:
        for layer, v in shifts.items():
            if site == "attn_head":

                def fn(z: Tensor, v: Tensor = v) -> Tensor | None:
                    return None if skip(z.shape[1]) else edit(z, v)

                handles.append(st.hook(layer, fn))
            else:

                def post(_m: nn.Module, _a: Any, output: Any, v: Tensor = v) -> Any:
                    out = output[0] if isinstance(output, tuple) else output
                    if not isinstance(out, Tensor) or out.shape[-1] != H * D:
                        raise RuntimeError(
                            f"attention output must be [B, T, {H * D}], got {getattr(out, 'shape', out)!r}"
                        )
                    if skip(out.shape[1]):
                        return None
                    new = edit(out, v)
                    return (new, *output[1:]) if isinstance(output, tuple) else new

                handles.append(st.attention_modules[layer].register_forward_hook(post))
    try:
        yield st
    finally:
        for h in handles:
            h.remove()


def sweep_alpha_k(
    model: nn.Module,
    eval_fn: Callable[[nn.Module], Mapping[str, float]],
    X: np.ndarray,
    probe: HeadProbeResult,
    ks: Sequence[int],
    alphas: Sequence[float],
    site: str = "attn_head",
    directions: np.ndarray | None = None,
) -> list[dict[str, float]]:
    """``eval_fn(model)`` under :func:`steer` for every ``k`` in ``ks`` (top-``k`` heads by
    ``probe.val_acc`` among those with a non-zero direction) and ``alpha`` in ``alphas``; ``directions [L, H, D]`` default to ``probe.coef``
    (binary probes). Returns one row ``{"k", "alpha", **metrics}`` per pair (``pandas.DataFrame(rows)``
    makes it a table)."""
    st = _site(model)
    Xa = _check_X(X)
    if Xa.shape[1:] != (st.n_layers, st.n_heads, st.d_head):
        raise ValueError(
            f"X must be [N, L, H, D] with (L, H, D) = {(st.n_layers, st.n_heads, st.d_head)} of the model, got {Xa.shape}"
        )
    if not isinstance(probe, HeadProbeResult):
        raise TypeError(f"probe must be a HeadProbeResult, got {type(probe).__name__}")
    dirs = probe.coef if directions is None else directions
    if np.ndim(dirs) != 3:
        raise ValueError(
            f"directions must be [L, H, D] (pick one class of a multinomial probe), got shape {np.shape(dirs)}"
        )
    if not ks or not alphas:
        raise ValueError("ks and alphas must be non-empty")
    # heads with a zero direction (constant activations) cannot be steered: rank them last
    score = np.where(np.linalg.norm(np.asarray(dirs), axis=-1) > 0, probe.val_acc, -1.0)
    rows = []
    for k in ks:
        ivs = build_interventions(Xa, top_k_heads(score, k), dirs)
        for a in alphas:
            with steer(st, ivs, float(a), site=site):
                rows.append({"k": float(k), "alpha": float(a), **eval_fn(st.model)})
    return rows
