"""Does splitting a prompt into other batches change the logits? (Why flash attention is off.)

    .venv/bin/python tools/batch_invariance.py [--threads N] [--flash]

Evaluates one chat prompt on the bundled model in one batch, then split at several points,
and prints the largest difference of the final logits for each split. A prefix cache can
only restore exactly if every split gives 0.0.
"""

from __future__ import annotations

import argparse

import numpy as np

from chatapp.engine.opening import NativeContext, NativeModel
from chatapp.model_files import bundled_model_path
from chatapp.prompting.chat_template import ChatTemplate
from chatapp.prompting.prompt import ChatMessage, PromptBuilder
from chatapp.vocabulary import Role


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--flash", action="store_true", help="flash attention on")
    args = parser.parse_args()
    model = NativeModel(bundled_model_path())
    context = NativeContext(
        model, n_sequences=1, n_ctx_per_sequence=1024, n_threads=args.threads, flash_attention=args.flash
    )
    template = ChatTemplate(model.chat_template() or "", model.token_text(model.bos_id), model.token_text(model.eos_id))
    persona = "You are a patient tutor. You explain one idea at a time, with a short example. " * 3
    tokens = PromptBuilder(template, model).build(
        [ChatMessage.of(Role.SYSTEM, persona), ChatMessage.of(Role.USER, "What is a verb?")]
    )

    def final_logits(splits: list[int]) -> np.ndarray:
        return context.logits_split_at(tokens, splits)

    whole = final_logits([])
    flash = "on" if context.shape.flash_attention else "off"
    print(f"flash attention {flash}, {args.threads} threads, {len(tokens)} tokens")
    for suffix in (1, 2, 3, 4, 5, 8, 13, 37, 61, len(tokens) - 1):
        difference = float(np.abs(final_logits([len(tokens) - suffix]) - whole).max())
        print(f"last {suffix:>3} tokens in their own batch: max |logit difference| {difference:.3g}")


if __name__ == "__main__":
    main()
