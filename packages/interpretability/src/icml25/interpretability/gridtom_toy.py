"""From Black Boxes to Transparent Minds (GridToM) — ICML 2025, P42: the GridToM-lite toy world and its small LM.

Li, Liu, Zou, Chen & Ma, "From Black Boxes to Transparent Minds: Evaluating and Enhancing the Theory of Mind
in Multimodal Large Language Models", ICML 2025 (arXiv 2506.14224; official code ``Annaisavailable/GridToM``):
GridToM-lite, the toy world of the reproduction, and the small language model trained on it.

GridToM-lite is a token-level false-belief world standing in for the paper's multigrid videos (an object is
put in a room, the protagonist ``P`` stays or leaves, a door stays open or closes, ``O`` moves the object; a
false belief arises when ``P`` was away or the door closed). Here: the episodes and their three prompt
formats (belief statements, belief questions, world questions), a biased training stream, an HF GPT-2
builder (extra ``[hf]``, imported lazily) and its training loop. The probes and the steering are in
:mod:`icml25.interpretability.gridtom`, which re-exports every name here.

Shapes: ``N`` samples, ``B`` rows, ``T`` positions, ``V`` vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from icml25.kernels.checks import check_choice, check_float, check_int, check_tensor
from icml25.kernels.rng import isolated_rng, make_generator

__all__ = [
    "BOS",
    "GRIDTOM_VOCAB",
    "NO",
    "PAD",
    "ROOMS",
    "TRIGGERS",
    "YES",
    "GridToMEpisode",
    "generate_gridtom_lite",
    "gridtom_gpt2",
    "gridtom_training_batch",
    "last_token_logits",
    "question_prompts",
    "render_tokens",
    "statement_prompts",
    "train_gridtom_lm",
]

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


def _check_triggers(triggers: Sequence[str]) -> tuple[str, ...]:
    if isinstance(triggers, str) or not isinstance(triggers, Sequence) or not triggers:
        raise ValueError(f"triggers must be a non-empty sequence of {TRIGGERS}, got {triggers!r}")
    return tuple(check_choice(t, f"triggers[{i}]", TRIGGERS) for i, t in enumerate(triggers))


def generate_gridtom_lite(
    n_pairs: int, seed: int = 0, triggers: Sequence[str] = TRIGGERS, tb_fb: str = "both", order: int = 1
) -> list[GridToMEpisode]:
    """``n_pairs`` TB/FB episode pairs (``2 n_pairs`` episodes, TB first in each pair; ``tb_fb="tb"`` or
    ``"fb"`` keeps one side). A pair shares the start room, the move target (always a different room) and
    a decoy (the third room). TB: ``P stays ; door open``. FB: ``P leaves``, ``door closes`` or both
    (``triggers``, drawn uniformly). Only first-order beliefs (``order=1``) are generated."""
    n_pairs = check_int(n_pairs, "n_pairs", low=1)
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
    batch = check_int(batch, "batch", low=1)
    w = np.asarray(mix, dtype=float)
    if w.shape != (4,) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"mix must be 4 non-negative weights with a positive sum, got {mix!r}")
    for name, v in (("question_fb_rate", question_fb_rate), ("fb_answer_world", fb_answer_world)):
        check_float(v, name, low=0.0, high=1.0)
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
    check_float(init_std, "init_std", low=0.0, low_open=True)
    for name, v in (("n_layers", n_layers), ("n_heads", n_heads), ("d_model", d_model)):
        check_int(v, name, low=1)
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
    check_tensor(ids, "ids", ndim=2, dtype="int", non_empty=True)
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
    steps = check_int(steps, "steps", low=1)
    check_int(statement_warmup, "statement_warmup", low=0)
    check_float(lr, "lr", low=0.0, low_open=True)
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
