"""Type-ahead: time to first token after Enter, with and without warming the question as it is typed.

Run from the repository root:

    .venv/bin/python bench/type_ahead.py              # 3 repetitions, medians (2-3 minutes on 2 cores)
    .venv/bin/python bench/type_ahead.py --reps 5
    .venv/bin/python bench/type_ahead.py --cps 5      # really type at 5 characters/s (minutes per repetition)

On the bundled model: a persona (~300 tokens) and a document (~1,500 tokens) are already warm
(resident in the conversation's sequence, as the app's warm-ahead leaves them), then a
~200-token question is

  (a) sent at once: the engine computes the whole question, the closing text and the header;
  (b) typed with type-ahead: revealed one character at a time; after each settled word the
      app's `Prewarmer` warms `draft_prompt_tokens(...)` (drafts: store=False). By default the
      script waits for each warm-up, which is what typing at 5 characters/s amounts to here
      (one word of prefill takes far less than a second); `--cps N` sleeps 1/N s per character
      instead and lets the warm-ups run behind the typing. Then Enter.

Time to first token is measured from Enter (building the prompt included) to the first
streamed token. Both variants must send the same prompt tokens and get the same
temperature-0 answer as a cold run (a separate cache-less engine, whole prompt computed);
the script exits with status 1 if not. Goal: (b) / (a) <= 0.3.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cache_bench import TextMaker  # noqa: E402  (bench/ is this script's folder)

from chatapp.documents import Document  # noqa: E402
from chatapp.engine.engine import Engine, EngineConfig, GenerationRequest, default_thread_count  # noqa: E402
from chatapp.engine.events import TokenText  # noqa: E402
from chatapp.engine.llama_native import SamplingParams  # noqa: E402
from chatapp.engine.prompt import ChatMessage, PromptBuilder  # noqa: E402
from chatapp.model_files import bundled_model_path  # noqa: E402
from chatapp.services.conversation import Conversation, document_block  # noqa: E402
from chatapp.services.warmup import Prewarmer, draft_prompt_tokens, settled_text  # noqa: E402

GOAL = 0.3
DOCUMENT_SUBJECTS = ["The northern warehouse", "Our Lyon office", "The night shift", "The new supplier", "The audit team", "Customer support"]
DOCUMENT_EVENTS = [
    "reported {n} late deliveries in week {w}, mostly on Mondays",
    "reduced average handling time to {n} minutes after the March reorganisation",
    "asked for {n} additional laptops before the end of quarter {q}",
    "found {n} invoices with missing purchase-order numbers",
    "moved {n} pallets of spare parts to the overflow site in week {w}",
    "scored {n} out of 100 in the internal satisfaction survey for quarter {q}",
    "logged {n} hours of overtime, twice the agreed budget",
    "closed {n} tickets older than thirty days",
]


def document_text(tokenize, target: int, seed: int = 7) -> str:  # type: ignore[no-untyped-def]
    """A report of ~`target` tokens: numbered findings drawn from fixed banks, reproducibly."""
    rng = random.Random(seed)
    text = "Quarterly operations report, all sites.\n\n"
    number = 0
    while len(tokenize(text)) < target:
        number += 1
        event = rng.choice(DOCUMENT_EVENTS).format(n=rng.randint(2, 480), w=rng.randint(1, 52), q=rng.randint(1, 4))
        text += f"{number}. {rng.choice(DOCUMENT_SUBJECTS)} {event}.\n"
    return text.rstrip("\n")


@dataclass
class Sample:
    ttft_ms: float
    computed_tokens: int
    reused_tokens: int
    prompt: tuple[int, ...]
    answer: tuple[int, ...]
    warm_ups: int = 0


class Scenario:
    """One conversation: persona and document warm in sequence 0, a question to send."""

    def __init__(self, engine: Engine, persona: str, document: Document, question: str, sampling: SamplingParams) -> None:
        self.engine = engine
        self.builder: PromptBuilder = engine.prompt_builder
        self.conversation = Conversation(system_prompt=persona, document=document)
        self.parts_before = (document_block(document),)
        self.question = question
        self.sampling = sampling
        self.warm_base = draft_prompt_tokens(self.builder, self.history(), self.parts_before, "")
        reset_text = "\u00a7 "
        self.reset = draft_prompt_tokens(self.builder, self.history(), self.parts_before, reset_text + "x")
        assert self.reset[: len(self.warm_base)] == self.warm_base and len(self.reset) > len(self.warm_base)
        assert self.reset[len(self.warm_base)] != self.prompt()[len(self.warm_base)]

    def history(self) -> list[ChatMessage]:
        return self.conversation.prompt_messages()

    def prompt(self) -> list[int]:
        """The prompt the app sends for the question (the conversation itself is left as it is)."""
        self.conversation.add_user(self.question)
        try:
            return self.builder.build(self.history())
        finally:
            self.conversation.drop_last()

    def start_warm(self) -> None:
        """Persona and document resident, nothing of the question: as after the app's warm-ahead.

        A prefill-only request of the prefix followed by a token the question does not start
        with cuts whatever the previous variant left after the document.
        """
        self.engine.generate(GenerationRequest(tuple(self.reset), self.sampling, sequence=0, prefill_only=True)).wait()

    def send(self, typed_ahead: Prewarmer | None = None) -> Sample:
        entered = time.perf_counter()
        prompt = tuple(self.prompt())
        if typed_ahead is not None:
            typed_ahead.before_send(prompt)
        handle = self.engine.generate(GenerationRequest(prompt, self.sampling))
        first_token_at = None
        for event in handle.events():
            if first_token_at is None and isinstance(event, TokenText):
                first_token_at = time.perf_counter()
        result = handle.wait()
        first_token_at = first_token_at or time.perf_counter()
        return Sample((first_token_at - entered) * 1000, result.stats.computed_tokens, result.stats.reused_tokens, prompt, result.token_ids)

    def at_once(self) -> Sample:
        self.start_warm()
        return self.send()

    def typed(self, cps: float) -> Sample:
        self.start_warm()
        prewarmer = Prewarmer(self.engine)
        warm_ups = 0
        last_settled = ""
        for end in range(1, len(self.question) + 1):
            draft = self.question[:end]
            if cps > 0:
                time.sleep(1 / cps)
            if settled_text(draft) == last_settled:
                continue
            last_settled = settled_text(draft)
            tokens = draft_prompt_tokens(self.builder, self.history(), self.parts_before, draft)
            warm_ups += prewarmer.warm(tokens, store=False) is not None
            if cps <= 0:
                prewarmer.wait()
        sample = self.send(prewarmer)
        sample.warm_ups = warm_ups
        return sample


def cold_answer(model_path: Path, args: argparse.Namespace, prompt: tuple[int, ...], sampling: SamplingParams) -> tuple[int, ...]:
    """The reference: a cache-less engine computing the whole prompt."""
    config = EngineConfig(model_path=model_path, context_cap=args.context, sequences=1, threads=args.threads)
    with Engine(config) as engine:
        return engine.generate(GenerationRequest(prompt, sampling, use_cache=False)).wait().token_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions; medians are reported")
    parser.add_argument("--cps", type=float, default=0.0, help="type at this many characters/s (default: wait for each warm-up)")
    parser.add_argument("--threads", type=int, default=default_thread_count())
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--persona-tokens", type=int, default=300)
    parser.add_argument("--document-tokens", type=int, default=1500)
    parser.add_argument("--question-tokens", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=32, help="answer length compared with the cold run")
    args = parser.parse_args()

    model_path = bundled_model_path()
    sampling = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    config = EngineConfig(model_path=model_path, context_cap=args.context, sequences=1, threads=args.threads)
    with Engine(config) as engine:
        texts = TextMaker(lambda text: engine.tokenize(text))
        persona = texts.persona(1, args.persona_tokens)
        document = Document(name="operations-report.txt", text=document_text(texts.tokenize, args.document_tokens))
        question = texts.question(1, args.question_tokens)
        scenario = Scenario(engine, persona, document, question, sampling)
        prompt = tuple(scenario.prompt())
        print(
            f"model {model_path.name}, {args.threads} threads; persona {len(engine.tokenize(persona))} tokens, "
            f"document {len(engine.tokenize(document.text))}, question {len(engine.tokenize(question))} "
            f"({len(question)} characters); prompt {len(prompt)} tokens",
            file=sys.stderr,
        )
        reference = cold_answer(model_path, args, prompt, sampling)
        engine.generate(GenerationRequest(tuple(scenario.warm_base), sampling, sequence=0, prefill_only=True)).wait()
        samples: dict[str, list[Sample]] = {"at once": [], "typed": []}
        for rep in range(args.reps):
            order = ["at once", "typed"] if rep % 2 == 0 else ["typed", "at once"]
            for name in order:
                sample = scenario.at_once() if name == "at once" else scenario.typed(args.cps)
                samples[name].append(sample)
                print(f"rep {rep + 1} {name:>7}: {sample.ttft_ms:8.1f} ms, computed {sample.computed_tokens}", file=sys.stderr)

    mismatches = [
        f"{name} rep {index + 1}: {'prompt' if sample.prompt != prompt else 'answer'} differs"
        for name, runs in samples.items()
        for index, sample in enumerate(runs)
        if sample.prompt != prompt or sample.answer != reference
    ]
    at_once = statistics.median(s.ttft_ms for s in samples["at once"])
    typed = statistics.median(s.ttft_ms for s in samples["typed"])
    ratio = typed / at_once
    typing = "waiting for each warm-up" if args.cps <= 0 else f"{args.cps:g} characters/s"
    print(f"\ntype-ahead, {len(prompt)}-token prompt, question {len(prompt) - len(scenario.warm_base)} tokens after the warm prefix; "
          f"{args.reps} reps, medians; typing: {typing}")
    print(f"  (a) sent at once          TTFT {at_once:8.1f} ms   computed {statistics.median(s.computed_tokens for s in samples['at once']):.0f} tokens")
    print(f"  (b) typed with type-ahead TTFT {typed:8.1f} ms   computed {statistics.median(s.computed_tokens for s in samples['typed']):.0f} tokens, "
          f"{statistics.median(s.warm_ups for s in samples['typed']):.0f} warm-ups")
    print(f"  b / a = {ratio:.3f}  (goal <= {GOAL}: {'met' if ratio <= GOAL else 'NOT met'})")
    print(f"  prompt tokens identical and temperature-0 answers equal to a cold run: {'yes' if not mismatches else 'NO'}")
    for line in mismatches:
        print(f"    {line}")
    sys.exit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
