"""The recorded training steps the simulator benchmarks replay: zoo, GRU loop, Hugging Face
models built from config, and the DTR authors' logs.

# NOTE [ Recorded steps ]
# 1. A step is a no-argument callable running one training step (forward, backward,
#    optimizer step) of a model built deterministically from seed 0; :func:`record` runs it
#    once unlimited under ``tritondtr.trace`` and returns the recording.
# 2. The zoo (tests/zoo.py) at a ``scale``; ``gru40``: an unrolled GRU cell, batch 32,
#    hidden 256, 40 steps, SGD.
# 3. Hugging Face (``pip install tritondtr[hf]``): GPT-2, BERT (masked LM) and Llama built
#    from small configs (2 layers, hidden 64, 4 heads, vocabulary 512, batch 4 x 32 tokens,
#    random init, CPU, eager attention), Adam. Without ``transformers`` they are skipped with
#    a printed reason, never an error.
# 4. ``tinygpt``: the demo's model (``tritondtr.demo.tinygpt``, default config), batch 8, AdamW,
#    its first step (NOTE [ The demo ] in tritondtr/demo/runs.py trains it the same way).
# 5. The DTR authors' logs are read from ../shared/traces/dtr-prototype/ (never copied into
#    the project); without that folder they are skipped with a printed reason.
# 6. ``unet``: a U-Net of the authors' log's shape (``unet.log``: two conv / batch norm / ReLU
#    per block, four max-pool levels down, four bilinear upsamplings with pad and skip
#    concatenation up, 19 convolutions, binary cross-entropy with logits), base width 16,
#    batch 2 x 3 x 96 x 96, SGD: the same graph recorded by ``tritondtr.trace``, with the
#    backward pass's storages flagged as the runtime saw them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository root, for the tests' helpers (tests.zoo)

import tritondtr  # noqa: E402
from tests import zoo  # noqa: E402

__all__ = [
    "DTR_LOGS",
    "DTR_LOG_DIR",
    "HF_MODELS",
    "dtr_log_traces",
    "gru_step",
    "hf_model",
    "hf_step",
    "record",
    "tinygpt_step",
    "unet_step",
    "zoo_step",
]

Step = Callable[[], object]
DTR_LOG_DIR = HERE.parent.parent / "shared" / "traces" / "dtr-prototype"
DTR_LOGS = ("resnet32", "densenet121", "transformer", "unet", "lstm")
HF_MODELS = ("gpt2", "bert", "llama")


def gru_step() -> Step:
    """NOTE [ Recorded steps ] rule 2: the unrolled GRU loop."""
    torch.manual_seed(0)
    cell = torch.nn.GRUCell(256, 256)
    x = torch.randn(40, 32, 256)
    opt = torch.optim.SGD(cell.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        h = torch.zeros(32, 256)
        for t in range(40):
            h = cell(x[t], h)
        h.square().mean().backward()
        opt.step()

    return step


def tinygpt_step() -> Step:
    """NOTE [ Recorded steps ] rule 4: one step of the demo's model."""
    from tritondtr.demo.tinygpt import GPTConfig, TinyGPT, batches

    config = GPTConfig()
    torch.manual_seed(0)
    model = TinyGPT(config)
    ((x, y),) = batches(config, 1, 8, 0, "cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
        opt.step()

    return step


def unet_step() -> Step:
    """NOTE [ Recorded steps ] rule 6."""
    case = zoo.unet_case(width=16, side=96)
    opt = torch.optim.SGD(case.model.parameters(), lr=1e-3)
    return lambda: zoo.train_step(case, opt)


def zoo_step(name: str, scale: int) -> Step:
    """One training step of zoo model ``name`` at width multiplier ``scale``."""
    case = zoo.make(name, seed=0, scale=scale)
    opt = torch.optim.Adam(case.model.parameters(), lr=1e-3)
    return lambda: zoo.train_step(case, opt)


def hf_model(
    name: str,
    *,
    layers: int = 2,
    width: int = 64,
    heads: int = 4,
    vocab: int = 512,
    positions: int = 64,
    dropout: float | None = None,
):
    """A Hugging Face ``name`` model (one of ``HF_MODELS``) built from config, seed 0, eager
    attention, in training mode (NOTE [ Recorded steps ] rule 3 gives the defaults).

    ``width`` is the hidden size (the MLP is 2x for BERT and Llama, 4x for GPT-2), ``positions``
    the longest sequence in tokens; ``dropout`` (a probability) replaces the config's dropout
    probabilities where given. Raises ImportError without ``transformers``."""
    import transformers as tf

    small = dict(
        hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads, vocab_size=vocab
    )
    if name == "gpt2":
        drop = (
            {}
            if dropout is None
            else dict.fromkeys(("resid_pdrop", "embd_pdrop", "attn_pdrop"), dropout)
        )
        cfg = tf.GPT2Config(
            n_embd=width,
            n_layer=layers,
            n_head=heads,
            vocab_size=vocab,
            n_positions=positions,
            bos_token_id=vocab - 1,
            eos_token_id=vocab - 1,
            **drop,
        )
        head = tf.GPT2LMHeadModel
    elif name == "bert":
        drop = (
            {}
            if dropout is None
            else dict.fromkeys(("hidden_dropout_prob", "attention_probs_dropout_prob"), dropout)
        )
        cfg = tf.BertConfig(
            **small, intermediate_size=2 * width, max_position_embeddings=positions, **drop
        )
        head = tf.BertForMaskedLM
    elif name == "llama":
        drop = {} if dropout is None else dict(attention_dropout=dropout)
        cfg = tf.LlamaConfig(
            **small,
            intermediate_size=2 * width,
            num_key_value_heads=max(1, heads // 2),
            max_position_embeddings=positions,
            **drop,
        )
        head = tf.LlamaForCausalLM
    else:
        raise ValueError(f"unknown Hugging Face model {name!r}; expected one of {HF_MODELS}")
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return head(cfg).train()


def hf_step(name: str) -> Step:
    """NOTE [ Recorded steps ] rule 3; raises ImportError without ``transformers``."""
    model = hf_model(name)
    ids = torch.randint(0, 512, (4, 32))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        torch.manual_seed(1)
        opt.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()

    return step


def record(step: Step) -> tritondtr.Recording:
    """NOTE [ Recorded steps ] rule 1."""
    with tritondtr.trace() as rec:
        step()
    return rec


def dtr_log_traces(names=DTR_LOGS) -> dict:
    """The DTR authors' logs as traces by name; {} (and a printed reason) without them."""
    if not DTR_LOG_DIR.is_dir():
        print(f"skipping the DTR authors' logs: {DTR_LOG_DIR} is absent")
        return {}
    from tritondtr.sim import load_trace

    return {f"dtr-{n}": load_trace(DTR_LOG_DIR / f"{n}.log") for n in names}
