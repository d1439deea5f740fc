"""The benchmark's workloads: reproducible prompts, as token lists built with the model's template.

Every workload is a fixed list of requests (prompt tokens) plus, for the restart workload, the
request before which the peer is restarted. Prompts never depend on what a peer answered:
earlier assistant turns of a conversation are generated text, the same for every peer, so every
peer sees exactly the same prompts and their answers can be compared token for token.

Texts are built from fixed sentence banks with seeded random choices (the `TextMaker` of
bench/cache_bench.py, moved here), grown until the model's tokenizer counts the target length.

  A  a 2,000-token system prompt, then 200-token questions; switches persona and back
  B  eight few-shot examples (500 tokens in all), then 100-token questions, 20 requests
  C  a 5,000-token document, then ten questions about it
  D  three personas, two documents, branching conversations, requests in a shuffled order
  E  restart: conversations begun, the peer restarted on the same folders, conversations continued
  F  an agent loop: clients at once, each sending a coding agent's ten tools (JSON schemas) with a
     5,000-token system prompt and tools in all, a task, then one tool call and its result per
     step (agent_tools.py), back to back; the peer restarted half-way
  K  a coding agent's session over Anthropic's Messages API (20,000 tokens of instructions and tools), a tool
     call and its result per turn, restarted half-way (run when asked)
  J  new conversations of a coding agent as Claude Code begins them, a sub-agent's request between two (run when
     asked)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from cache.keys import as_token_array, common_prefix_length
from chatapp.benchmark.agent_tools import TOOL_SET, AgentTexts
from chatapp.benchmark.tool_template import server_template_for
from chatapp.documents import Document
from chatapp.engine.opening import open_prompt_builder
from chatapp.prompting.planner import PromptPlanner
from chatapp.prompting.prompt import ChatMessage
from chatapp.services.messages import Turn, conversation_messages, next_question_parts
from chatapp.tools import ToolResult, ToolSpec
from chatapp.vocabulary import Role

WORKLOAD_NAMES = ("A", "B", "C", "D", "E", "F")
CODER_NAME = "K"  # a coding agent over Anthropic's Messages API: run when asked (it needs a long context)
NEW_CONVERSATIONS_NAME = "J"  # new conversations of a Claude-Code-shaped agent: run when asked (a long context)
AGENT_NAMES = (CODER_NAME, NEW_CONVERSATIONS_NAME)  # sent as messages: each server builds its own prompt
BACK = "back:"  # A: a request to a persona asked before, after another one (goal A's requests)


@dataclass(frozen=True)
class Scale:
    """Target sizes in tokens (and request counts) for one run."""

    name: str
    system: int  # A: the long system prompt
    question: int  # A, C, D, E: a question
    fewshot_total: int  # B: all eight examples together
    fewshot_question: int  # B
    fewshot_requests: int  # B
    document: int  # C
    document_questions: int  # C
    persona: int  # D, E
    doc_small: int  # D, E: documents
    turns: int  # D, E: turns per conversation
    answer: int  # earlier assistant turns in a conversation
    max_tokens: int  # answer length asked of every peer
    context: int  # context per sequence (every peer)
    sessions: int = 5  # D: conversations (the first three cover the three personas and two documents)
    agent_system: int = 5000  # F: the system prompt and the tools (at least the tools' schemas: ~1,300)
    agent_step: int = 150  # F: the task, and each step's tool call and result together
    agent_turns: int = 6  # F: turns per client (half before the restart)
    agent_clients: int = 3  # F: clients at once
    agent_context: int = 8192  # F: context per conversation at least (the tools alone outgrow a small one)
    coder_system: int = 20_000  # K: the system prompt and the tools, as Claude Code's first request (~19,600)
    coder_turns: int = 10  # K: turns of one session (restarted half-way)
    new_conversations: int = 5  # J: new conversations in a row
    agent_types: int = 1500  # J: the system message sent after each conversation's first question
    sub_agent_system: int = 3000  # J: a sub-agent's own instructions (one request between conversations)
    lookup_conversations: int = 10_000  # L: conversations in the index a lookup searches
    storage_conversations: int = 50  # S: conversations on one persona stored through the engine
    restore_repeats: int = 5  # R: restores of one prefix by each path
    miss_repeats: int = 2  # R: novel prompts with and without the cache, in turns
    stream_clients: tuple[int, ...] = (1, 2, 3, 4)  # N: clients at once, each count in turn
    stream_rounds: int = 3  # N: rounds per count (sides interleaved)
    stream_answer: int = 128  # N: answer tokens asked of each client
    trace_scale: float = 1.0  # G: population, sessions and RAM budget of the request traces (no model: seconds)


SCALES = {
    "full": Scale(
        "full",
        system=2000,
        question=200,
        fewshot_total=500,
        fewshot_question=100,
        fewshot_requests=20,
        document=5000,
        document_questions=10,
        persona=1000,
        doc_small=1500,
        turns=3,
        answer=120,
        max_tokens=32,
        context=8192,
    ),
    # A first look in under four minutes on two cores (nine peers, six workloads): prompts of a
    # few hundred tokens, so its ratios say more about fixed costs than about the cache.
    "quick": Scale(
        "quick",
        system=40,
        question=10,
        fewshot_total=48,
        fewshot_question=8,
        fewshot_requests=3,
        document=120,
        document_questions=2,
        persona=30,
        doc_small=40,
        turns=1,
        answer=8,
        max_tokens=2,
        context=512,
        sessions=3,
        lookup_conversations=1000,
        storage_conversations=5,
        agent_system=2500,
        agent_step=60,
        agent_turns=4,
        agent_clients=2,
        agent_context=4096,
        coder_system=2000,
        coder_turns=4,
        new_conversations=3,
        agent_types=300,
        sub_agent_system=400,
        stream_clients=(1, 3),
        stream_rounds=2,
        stream_answer=32,
    ),
    "tiny": Scale(
        "tiny",
        system=60,
        question=10,
        fewshot_total=48,
        fewshot_question=8,
        fewshot_requests=3,
        document=80,
        document_questions=2,
        persona=30,
        doc_small=40,
        turns=2,
        answer=8,
        max_tokens=4,
        context=512,
        lookup_conversations=200,
        storage_conversations=3,
        restore_repeats=2,
        miss_repeats=1,
        trace_scale=0.1,
        agent_system=80,
        agent_step=10,
        agent_turns=2,
        agent_clients=2,
        agent_context=2048,
        coder_system=300,
        coder_turns=2,
        new_conversations=2,
        agent_types=40,
        sub_agent_system=60,
        stream_clients=(1, 3),
        stream_rounds=1,
        stream_answer=4,
    ),
}


@dataclass(frozen=True)
class Draft:
    """How the app would have built a request's last message: for warm-ahead and type-ahead peers.

    `messages`: the branch before the question; `parts_before`: what the question message
    carries before the typed text (the document block); `question`: the text the user types.
    """

    messages: tuple[ChatMessage, ...]
    parts_before: tuple[str, ...]
    question: str


@dataclass(frozen=True)
class Request:
    label: str
    tokens: tuple[int, ...]
    client: int = 0  # F: which of the clients sends it (each sends its requests in order)
    # Tokens a perfect cache could hold before this request: the longest prefix shared with an
    # earlier request, or the warm-ahead prefix (persona, document) when the request has a draft.
    known_prefix: int = 0
    draft: Draft | None = None
    # Where a later prompt is likely to leave this one (persona, document, history ends), as the
    # app names them: a model whose state cannot be cut is checkpointed there.
    boundaries: tuple[int, ...] = ()
    # F: what a client would send for these tokens: the chat messages (tool calls, results) and tools.
    messages: tuple[ChatMessage, ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    # J: what Claude Code sends beside the messages chatapp builds the prompt of: a billing line as the first
    # system block (left out of chatapp's prompt), and the end of the system prompt as a system message after
    # the first question (its agent types, told with chatapp's system prompt).
    billing_line: str = ""
    after_question: str = ""


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    requests: tuple[Request, ...]
    restart_before: int | None = None  # E: a new peer instance on the same folders serves requests from here on
    # Throughput workloads (B, D) send each request as soon as the last answer is in; the others
    # let the peer settle between requests, as a user reading the answer does.
    back_to_back: bool = False
    clients: int = 1  # F: clients sending their requests at once (their `Request.client`)
    context: int = 0  # F: the context per conversation its prompts need, when the run's is smaller
    protocol: str = "tokens"  # how requests are sent: prompt tokens, or "anthropic" (K: messages and tools)
    # K on a model whose own template has no tools: the template llama-server is given (tool_template.py).
    server_template: str | None = None
    # K, J: the requests whose answers are checked against the same prompt computed cold.
    cold_checked: tuple[int, ...] = ()

    @property
    def prompt_tokens(self) -> int:
        return sum(len(request.tokens) for request in self.requests)


# --------------------------------------------------------------------------------------------
# Deterministic, varied, realistic text (moved from bench/cache_bench.py).

PERSONA_OPENERS = [
    "You are {name}, a senior {domain} assistant working for a mid-sized firm in Lyon.",
    "You are {name}, an experienced {domain} consultant who answers questions from colleagues.",
    "You are {name}, the {domain} help desk of a public library network.",
]
PERSONA_SECTIONS = {
    "Tone": [
        "Be warm but concise, and never pad an answer with compliments.",
        "Address the user by their first name only when they have given it.",
        "Prefer plain words to jargon; when a technical term is unavoidable, define it in one short clause.",
        "If the user is frustrated, acknowledge it in one sentence and then move on to the fix.",
        "Do not use exclamation marks except when quoting someone.",
        "Avoid hedging phrases such as 'it might be possible that' when you are in fact sure.",
        "Keep a neutral register: no slang, no emoji, no rhetorical questions.",
        "When you disagree with the user, say so directly and give the reason in one sentence.",
    ],
    "Format": [
        "Start with a one-sentence answer, then give details under short headings.",
        "Use numbered lists for steps that must happen in order and bullets for everything else.",
        "Put code, commands and file paths in backticks, and full programs in fenced blocks with a language tag.",
        "Keep paragraphs under five sentences; split longer reasoning into several paragraphs.",
        "Write dates as 2024-03-15 and times in 24-hour format with the time zone.",
        "Use metric units first and give imperial units in parentheses when the user seems to be in the US.",
        "End every answer longer than ten lines with a two-line summary labelled 'In short'.",
        "Tables are welcome for comparisons of three or more options, with at most six columns.",
    ],
    "Scope": [
        "You answer questions about {domain} only; politely redirect anything else to the right team.",
        "You may explain general principles, but you do not give advice that requires a licensed professional.",
        "When a question depends on a jurisdiction, ask which one before answering in detail.",
        "You can draft emails, checklists and short reports, but you never send anything yourself.",
        "Refuse requests to produce personal data about real private individuals.",
        "If a request is ambiguous, state the two most likely readings and answer the more common one.",
        "Do not speculate about internal company matters you have not been told about.",
        "You may summarise documents the user pastes, keeping their structure and key numbers.",
    ],
    "Knowledge": [
        "Your knowledge of {domain} regulations is current as of the last quarterly update.",
        "The firm's internal handbook is the reference when it conflicts with general practice.",
        "Cite the section number of a standard when you rely on it, for example ISO 9001 clause 7.5.",
        "When numbers are involved, show the calculation in one line so the user can check it.",
        "Distinguish clearly between what is required, what is recommended and what is merely common.",
        "Say 'I do not know' when you do not know, and suggest where the answer could be found.",
        "Older guidance from before 2019 is superseded unless the user says otherwise.",
        "Regional offices in Marseille and Grenoble follow the same procedures as headquarters.",
    ],
    "Process": [
        "Before a long answer, check whether the user wants a quick overview or a full walkthrough.",
        "For every multi-step procedure, mention the step most people get wrong.",
        "When the user shares an error message, quote the relevant line back before explaining it.",
        "If you make an assumption, label it 'Assumption:' so it can be corrected.",
        "Offer at most one follow-up suggestion at the end of an answer.",
        "When you correct an earlier answer of yours, say exactly what changed.",
        "Escalate to a human colleague when the user mentions a deadline within 24 hours.",
        "Keep track of what the user already told you in this conversation and do not ask again.",
    ],
}
DOMAINS = [
    ("Ada", "legal compliance"),
    ("Bruno", "travel planning"),
    ("Chloe", "tax and accounting"),
    ("Dario", "IT support"),
]
QUESTION_SENTENCES = [
    "Last week our team moved the quarterly review from Tuesday to Thursday because of the holiday.",
    "The client, a bakery chain with fourteen shops, asked us to double-check their supplier contracts.",
    "I have a spreadsheet with about 2,300 rows, one per invoice, and some of the dates are in the wrong format.",
    "My manager wants a one-page summary by Friday, but the source documents total around eighty pages.",
    "We tried the procedure from the handbook twice and both times the second step failed without an error.",
    "The office in Grenoble uses a slightly different template, which may explain the mismatch.",
    "Two of the contracts were signed before the 2019 update and one of them was amended in 2021.",
    "Our budget for this is limited, so I would rather avoid anything that needs an external expert.",
    "The person who set this up has left the company and did not write anything down.",
    "I am not sure whether the rules apply to part-time staff as well as to full-time employees.",
    "A colleague suggested simply deleting the duplicates, but I worry that some of them are not real duplicates.",
    "The customer replied that the numbers in our last report did not add up to the total on page three.",
    "We need to keep a record of every change for the auditors, who come back in September.",
    "Some of the files are scanned PDFs and others are exported directly from the accounting system.",
    "The deadline was already extended once and I do not think we can ask again.",
    "I read two articles on this that seemed to contradict each other on the main point.",
]
QUESTION_ENDINGS = [
    "What would you do first, and what should I avoid?",
    "Can you give me a step-by-step plan that I can follow this afternoon?",
    "Which of these problems should I fix first, and why?",
    "How do I explain this to my manager in two or three sentences?",
    "Is there a quick check I can run to see how bad the situation is?",
]
REPORT_SUBJECTS = [
    "the Lyon warehouse",
    "the spring ticket backlog",
    "supplier contract renewals",
    "the new payroll system",
    "the Grenoble office move",
    "customer refunds",
    "the annual audit",
    "laptop replacements",
]
REPORT_SENTENCES = [
    "In {month}, {subject} accounted for {n} hours of work across {m} teams.",
    "The main delay on {subject} came from approvals that waited {m} days on average.",
    "Costs for {subject} rose by {n} percent compared with the same month last year.",
    "A review of {subject} found {m} open issues, of which {k} were marked as blocking.",
    "The steering group agreed to revisit {subject} once the {month} figures are final.",
    "Staff surveyed about {subject} rated the process {k} out of 10 on average.",
    "Two vendors bid for {subject}; the cheaper offer was {n} euros lower but came without support.",
    "The handbook section on {subject} was last updated in {month} and is now partly out of date.",
]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October"]
FEWSHOT_LABELS = ["billing", "shipping", "account", "technical", "other"]
FEWSHOT_OPENERS = ["My", "Our", "The", "This week the", "Yesterday the", "Since Monday the"]
FEWSHOT_OBJECTS = [
    "invoice",
    "parcel",
    "password reset",
    "printer driver",
    "delivery address",
    "card payment",
    "login page",
    "refund",
    "VPN client",
    "order number",
]
FEWSHOT_PROBLEMS = [
    "shows the wrong amount",
    "has not arrived",
    "keeps failing",
    "crashes on start",
    "was charged twice",
    "cannot be changed",
    "times out after a minute",
    "is missing",
]


class TextMaker:
    """Builds texts of about N tokens from fixed sentence banks, deterministically."""

    def __init__(self, tokenize: Callable[[str], list[int]]) -> None:
        self.tokenize = tokenize

    def grow(self, head: str, pieces: Iterator[str], target: int) -> str:
        text = head
        for piece in pieces:
            if len(self.tokenize(text)) >= target:
                break
            text += piece
        return text

    def persona(self, seed: int, target: int) -> str:
        rng = random.Random(seed)
        name, domain = DOMAINS[seed % len(DOMAINS)]
        head = rng.choice(PERSONA_OPENERS).format(name=name, domain=domain) + f" Persona reference P-{seed:04d}.\n"

        def pieces() -> Iterator[str]:
            rule = 0
            while True:
                for section in rng.sample(list(PERSONA_SECTIONS), len(PERSONA_SECTIONS)):
                    yield f"\n## {section}\n"
                    for sentence in rng.sample(PERSONA_SECTIONS[section], rng.randint(3, 6)):
                        rule += 1
                        yield f"- Rule {seed}.{rule}: " + sentence.format(domain=domain) + "\n"

        return self.grow(head, pieces(), target)

    def question(self, seed: int, target: int) -> str:
        rng = random.Random(10_000 + seed)
        head = f"Ticket {seed * 7919 % 100_000:05d} ({rng.choice(['urgent', 'routine', 'follow-up', 'new'])}): "

        return self.shuffled(rng, head, QUESTION_SENTENCES, max(target - 12, 1)) + rng.choice(QUESTION_ENDINGS)

    def shuffled(
        self, rng: random.Random, head: str, bank: list[str], target: int, fill: Callable[[str], str] = str
    ) -> str:
        """`head`, then the bank's sentences (each through `fill`) in shuffled rounds, to about `target` tokens."""

        def pieces() -> Iterator[str]:
            while True:
                for sentence in rng.sample(bank, len(bank)):
                    yield fill(sentence) + " "

        return self.grow(head, pieces(), target)

    def document(self, seed: int, target: int) -> str:
        """A report of numbered paragraphs of plausible figures."""
        rng = random.Random(20_000 + seed)
        head = f"Quarterly operations report R-{seed:04d}\n"

        def pieces() -> Iterator[str]:
            paragraph = 0
            while True:
                paragraph += 1
                sentences = []
                for _ in range(rng.randint(3, 5)):
                    sentences.append(
                        rng.choice(REPORT_SENTENCES).format(
                            month=rng.choice(MONTHS),
                            subject=rng.choice(REPORT_SUBJECTS),
                            n=rng.randint(2, 400),
                            m=rng.randint(2, 30),
                            k=rng.randint(1, 9),
                        )
                    )
                yield f"\n{paragraph}. " + " ".join(sentences) + "\n"

        return self.grow(head, pieces(), target)

    def answer(self, seed: int, target: int) -> str:
        """An earlier assistant turn (the same for every peer, whatever the peer answered)."""
        rng = random.Random(30_000 + seed)
        head = "Here is what I would do. "

        def pieces() -> Iterator[str]:
            step = 0
            while True:
                step += 1
                rule = rng.choice(PERSONA_SECTIONS[rng.choice(list(PERSONA_SECTIONS))]).format(domain="this")
                yield f"Step {step}: {rule} "

        return self.grow(head, pieces(), target)

    def rules(self, seed: int, target: int, bullet: str) -> str:
        """Lines of rules from the persona banks, about `target` tokens (nothing for 0 or less)."""
        if target <= 0:
            return ""
        rng = random.Random(50_000 + seed)

        def pieces() -> Iterator[str]:
            while True:
                rule = rng.choice(PERSONA_SECTIONS[rng.choice(list(PERSONA_SECTIONS))])
                yield bullet + rule.format(domain="the repository") + "\n"

        return self.grow("", pieces(), target).rstrip("\n")

    def fewshot_example(self, seed: int, target: int) -> tuple[str, str]:
        """(a customer message, its label): one few-shot example of about `target` tokens."""
        rng = random.Random(40_000 + seed)
        label = FEWSHOT_LABELS[seed % len(FEWSHOT_LABELS)]
        text = f"{rng.choice(FEWSHOT_OPENERS)} {rng.choice(FEWSHOT_OBJECTS)} {rng.choice(FEWSHOT_PROBLEMS)}."

        def pieces() -> Iterator[str]:
            while True:
                yield f" Also the {rng.choice(FEWSHOT_OBJECTS)} {rng.choice(FEWSHOT_PROBLEMS)}."

        return self.grow(text, pieces(), max(target - 8, 1)), f"Category: {label}"


# --------------------------------------------------------------------------------------------
# Prompt building with the model's tokenizer and chat template (no context needed).


class PromptKit:
    """The model's vocabulary and chat template, loaded without weights, to build prompts."""

    def __init__(self, model_path: Path) -> None:
        self.builder = open_prompt_builder(model_path)
        self.texts = TextMaker(self.tokenize)
        self.boundaries: dict[tuple[int, ...], tuple[int, ...]] = {}  # by prompt, as `build` made them

    def tokenize(self, text: str) -> list[int]:
        return self.builder.tokenizer.tokenize(text, add_special=False, parse_special=False)

    def context_limit(self) -> int:
        """The longest prompt the model was trained for (K sizes its prompt within it)."""
        return int(getattr(self.builder.tokenizer, "n_ctx_train", 0) or 8192)

    def build(self, messages: list[ChatMessage], tools: tuple[ToolSpec, ...] = ()) -> tuple[int, ...]:
        """The prompt as the app plans it (messages.py, prompt_plan.py), its checkpoints remembered.

        With `tools`, the prompt offers them as a server builds it for a request that sends them.
        """
        plan = PromptPlanner(self.builder.with_tools(tools)).plan(messages, checkpoints=True)
        self.boundaries[plan.tokens] = plan.checkpoints
        return plan.tokens

    def close(self) -> None:
        self.builder.close()


def with_known_prefixes(kit: PromptKit, requests: list[Request]) -> tuple[Request, ...]:
    """Each request with `known_prefix` set: what an ideal cache would already hold for it."""
    done: list[Request] = []
    for request in requests:
        array = as_token_array(request.tokens)
        known = max((common_prefix_length(array, as_token_array(earlier.tokens)) for earlier in done), default=0)
        if request.draft is not None:
            warm = PromptPlanner(kit.builder).draft_tokens(request.draft.messages, request.draft.parts_before, "")
            if tuple(warm) == request.tokens[: len(warm)]:
                known = max(known, len(warm))
        done.append(replace(request, known_prefix=min(known, len(request.tokens) - 1)))
    return tuple(done)


def _conversation_prompts(
    kit: PromptKit, persona: str | None, document: Document | None, questions: list[str], answers: list[str]
) -> list[tuple[int, ...]]:
    """The prompt of each turn of one conversation (turn i sees the earlier questions and answers)."""
    turns: list[Turn] = []
    prompts = []
    for question, answer in zip(questions, answers, strict=True):
        turns.append(Turn(Role.USER, question))
        prompts.append(kit.build(conversation_messages(persona, document, turns)))
        turns.append(Turn(Role.ASSISTANT, answer))
    return prompts


def workload_a(kit: PromptKit, scale: Scale) -> Workload:
    t = kit.texts
    p1, p2 = t.persona(1, scale.system), t.persona(2, scale.system)

    def ask(persona: str, seed: int) -> tuple[int, ...]:
        return kit.build(conversation_messages(persona, None, [Turn(Role.USER, t.question(seed, scale.question))]))

    plan = [
        ("P1 q1", p1, 1),
        ("P1 q2", p1, 2),
        ("P1 q3", p1, 3),
        ("switch: P2 q4", p2, 4),
        ("P2 q5", p2, 5),
        (f"{BACK} P1 q6", p1, 6),
        (f"{BACK} P2 q7", p2, 7),
        (f"{BACK} P1 q8", p1, 8),
    ]
    return Workload(
        "A",
        "long system prompt; switch persona and back",
        with_known_prefixes(kit, [Request(label, ask(persona, seed)) for label, persona, seed in plan]),
    )


def workload_b(kit: PromptKit, scale: Scale) -> Workload:
    t = kit.texts
    persona = "Classify each customer message into one category: " + ", ".join(FEWSHOT_LABELS) + "."
    examples: list[Turn] = []
    for example in range(8):
        text, label = t.fewshot_example(example, scale.fewshot_total // 8)
        examples += [Turn(Role.USER, text), Turn(Role.ASSISTANT, label)]
    requests = []
    for number in range(scale.fewshot_requests):
        question = Turn(Role.USER, t.question(100 + number, scale.fewshot_question))
        requests.append(
            Request(f"q{number + 1}", kit.build(conversation_messages(persona, None, [*examples, question])))
        )
    return Workload(
        "B", "eight few-shot examples, then short questions", with_known_prefixes(kit, requests), back_to_back=True
    )


def workload_c(kit: PromptKit, scale: Scale) -> Workload:
    t = kit.texts
    document = Document("report.txt", t.document(1, scale.document))
    persona = "You are a careful analyst. Answer from the document only, and quote the paragraph number."
    requests = []
    for number in range(scale.document_questions):
        question = t.question(200 + number, scale.question)
        messages = conversation_messages(persona, document, [Turn(Role.USER, question)])
        draft = Draft(tuple(conversation_messages(persona, None, [])), next_question_parts(document, []), question)
        requests.append(Request(f"q{number + 1}", kit.build(messages), draft=draft))
    return Workload("C", "one long document, several questions", with_known_prefixes(kit, requests))


def workload_d(kit: PromptKit, scale: Scale, seed: int = 4) -> Workload:
    t = kit.texts
    personas = [t.persona(10 + number, scale.persona) for number in range(3)]
    documents = [Document(f"report-{number}.txt", t.document(10 + number, scale.doc_small)) for number in range(2)]
    # (persona, document, question seeds); the branches repeat a conversation's first turns
    # and then ask another question (an edited message: a sibling branch).
    plans = [(0, None), (1, 0), (2, 1), (0, 1), (1, None)][: scale.sessions]
    conversations: list[list[Request]] = []
    for number, (persona, document) in enumerate(plans):
        questions = [t.question(300 + 10 * number + turn, scale.question) for turn in range(scale.turns)]
        answers = [t.answer(300 + 10 * number + turn, scale.answer) for turn in range(scale.turns)]
        prompts = _conversation_prompts(
            kit, personas[persona], documents[document] if document is not None else None, questions, answers
        )
        conversations.append([Request(f"c{number + 1} t{turn + 1}", prompt) for turn, prompt in enumerate(prompts)])
        if number < 2:  # a branch: the last question edited
            edited = [*questions[:-1], t.question(900 + number, scale.question)]
            branch = _conversation_prompts(
                kit, personas[persona], documents[document] if document is not None else None, edited, answers
            )
            conversations.append([Request(f"c{number + 1} branch t{scale.turns}", branch[-1])])
    # Interleave: a seeded shuffle of which conversation speaks next, each in its own order
    # (a branch after the turns it branches from).
    rng = random.Random(seed)
    order: list[Request] = []
    queues = [list(conversation) for conversation in conversations]
    pending = {index: 0 for index in range(len(queues))}
    while any(pending[index] < len(queue) for index, queue in enumerate(queues)):
        ready = [
            index
            for index, queue in enumerate(queues)
            if pending[index] < len(queue) and _branch_ready(index, pending, queues)
        ]
        index = rng.choice(ready)
        order.append(queues[index][pending[index]])
        pending[index] += 1
    return Workload(
        "D",
        "three personas, two documents, branching conversations, interleaved",
        with_known_prefixes(kit, order),
        back_to_back=True,
    )


def _branch_ready(index: int, pending: dict[int, int], queues: list[list[Request]]) -> bool:
    """A branch (a one-request list labelled 'branch') goes after the conversation before it."""
    queue = queues[index]
    if "branch" not in queue[0].label or index == 0:
        return True
    return pending[index - 1] >= len(queues[index - 1]) - 1


def workload_e(kit: PromptKit, scale: Scale) -> Workload:
    t = kit.texts
    persona = t.persona(20, scale.persona)
    document = Document("handbook.txt", t.document(20, scale.doc_small))
    turns = scale.turns + 1  # the last turn after the restart
    conversations = []
    for number, doc in enumerate([document, None]):
        questions = [t.question(500 + 10 * number + turn, scale.question) for turn in range(turns)]
        answers = [t.answer(500 + 10 * number + turn, scale.answer) for turn in range(turns)]
        conversations.append(_conversation_prompts(kit, persona, doc, questions, answers))
    before = turns - 1
    requests = []
    for turn in range(before):
        for number, prompts in enumerate(conversations):
            requests.append(Request(f"c{number + 1} t{turn + 1}", prompts[turn]))
    restart = len(requests)
    for number, prompts in enumerate(conversations):
        requests.append(Request(f"after restart: c{number + 1} t{turns}", prompts[turns - 1]))
    fresh = _conversation_prompts(kit, persona, document, [t.question(590, scale.question)], [""])[0]
    requests.append(Request("after restart: new conversation, same persona and document", fresh))
    return Workload(
        "E",
        "restart: a new instance on the same folders continues the conversations",
        with_known_prefixes(kit, requests),
        restart,
    )


def workload_f(kit: PromptKit, scale: Scale) -> Workload:
    """Clients of one coding agent: the same system prompt and tools, each its own task and tool calls.

    Every request sends the tools; a client's history is its task, then per step the call the
    agent made (an assistant message of one tool call) and the tool's output (a tool message).
    A client's request k is that history up to step k-1: what the agent sends for its k-th answer.
    """
    agent = AgentTexts(kit.texts)
    persona = agent.persona(1, scale.agent_system // 5)
    system = conversation_messages(persona, None, [])
    bare = len(kit.builder.with_tools(agent.tools(1, 0)).build(system))
    tools = agent.tools(1, (scale.agent_system - bare) // len(TOOL_SET))
    conversations: list[list[Request]] = []
    for client in range(scale.agent_clients):
        task = agent.task(700 + client, scale.agent_step)
        messages = conversation_messages(persona, None, [Turn(Role.USER, task)])
        prompts = []
        for number in range(scale.agent_turns):
            prompt = kit.build(messages, tools)
            prompts.append(Request("", prompt, client, messages=tuple(messages), tools=tools))
            messages += _agent_step(kit, agent, tools, messages, prompt, client, number, scale.agent_step)
        conversations.append(prompts)
    requests: list[Request] = []
    restart = None
    for turn in range(scale.agent_turns):
        if turn == scale.agent_turns // 2:
            restart = len(requests)
        for client, prompts in enumerate(conversations):
            label = f"{'after restart: ' if restart is not None else ''}client {client + 1} step {turn + 1}"
            requests.append(replace(prompts[turn], label=label))
    return Workload(
        "F",
        "agent loop: clients at once with a coding agent's tools, tool calls and results, restarted half-way",
        with_known_prefixes(kit, requests),
        restart,
        back_to_back=True,
        clients=scale.agent_clients,
        context=scale.agent_context,
    )


def workload_k(kit: PromptKit, scale: Scale) -> Workload:
    """One coding-agent session as Claude Code sends it over Anthropic's Messages API: a long system prompt
    and tool schemas (about 20,000 tokens, within the model's trained context), then turns of a tool call and
    its result, each request the whole history; the server restarts half-way."""
    agent = AgentTexts(kit.texts)
    room = kit.context_limit() - scale.coder_turns * (scale.agent_step + 64) - 256
    system_tokens = max(256, min(scale.coder_system, room))
    # The length is in the system prompt, the tools are their schemas: servers that drop a tool's
    # description for a template without tools (llama-server) then compute as long a prompt as chatapp.
    tools = agent.tools(2, 0)
    bare = len(kit.builder.with_tools(tools).build(conversation_messages("", None, [])))
    persona = agent.persona(2, max(64, system_tokens - bare))
    messages = conversation_messages(persona, None, [Turn(Role.USER, agent.task(900, scale.agent_step))])
    requests = []
    for number in range(scale.coder_turns):
        prompt = kit.build(messages, tools)
        restarted = number >= scale.coder_turns // 2
        label = f"{'after restart: ' if restarted else ''}turn {number + 1}"
        requests.append(Request(label, prompt, 0, messages=tuple(messages), tools=tools))
        messages += _agent_step(kit, agent, tools, messages, prompt, 0, number, scale.agent_step)
    longest = max(len(request.tokens) for request in requests)
    return Workload(
        CODER_NAME,
        f"coding agent over Anthropic's Messages API: {len(requests[0].tokens):,} tokens of instructions and tools, "
        "a tool call and its result per turn, restarted half-way",
        with_known_prefixes(kit, requests),
        scale.coder_turns // 2,
        context=_context_for(longest),
        protocol="anthropic",
        server_template=server_template_for(kit.builder, requests),
        cold_checked=tuple(sorted({scale.coder_turns // 2, scale.coder_turns - 1})),  # after the restart
    )


def workload_j(kit: PromptKit, scale: Scale) -> Workload:
    """New conversations of a coding agent, one after another, each begun as Claude Code begins one over
    Anthropic's Messages API: the same instructions and tools (about 20,000 tokens) after a billing line whose
    last part changes with every conversation, a reminder with the date, the question, then ~1,500 tokens of
    agent types as a system message; between the second and the third, a sub-agent's request (instructions
    and a task of its own). Every conversation after the first should compute only its question."""
    agent = AgentTexts(kit.texts)
    tools = agent.tools(2, 0)
    room = kit.context_limit() - scale.agent_types - 2 * scale.agent_step - 512
    bare = len(kit.builder.with_tools(tools).build(conversation_messages("", None, [])))
    instructions = agent.persona(4, max(64, min(scale.coder_system, room) - bare))
    agent_types = "Available agent types for the Agent tool:\n" + agent.persona(5, scale.agent_types)
    system = f"{instructions}\n\n{agent_types}"  # as chatapp tells them (anthropic_fields.system_prompt)
    reminder = "<system-reminder>\n# currentDate\nToday's date is 2026-12-06.\n</system-reminder>\n"
    rng = random.Random(1_256)
    requests = []
    for number in range(scale.new_conversations):
        if number == min(2, scale.new_conversations - 1):
            sub_system = agent.persona(6, scale.sub_agent_system)
            task = agent.task(1_300, scale.agent_step)
            sub_tools = tools[: len(tools) // 2]
            messages = conversation_messages(sub_system, None, [Turn(Role.USER, task)])
            requests.append(_claude_code_request(kit, "sub-agent", messages, sub_tools, rng, ""))
        question = agent.task(1_200 + number, scale.agent_step)
        messages = conversation_messages(system, None, [Turn(Role.USER, reminder + question)])
        label = f"conversation {number + 1}"
        requests.append(_claude_code_request(kit, label, messages, tools, rng, agent_types))
    longest = max(len(request.tokens) for request in requests)
    firsts = [index for index, request in enumerate(requests) if request.label.startswith("conversation")]
    return Workload(
        NEW_CONVERSATIONS_NAME,
        f"new coding-agent conversations as Claude Code begins them: {len(requests[0].tokens):,} tokens of "
        "instructions, tools and agent types, a question each, a sub-agent's request between two",
        with_known_prefixes(kit, requests),
        context=_context_for(longest),
        protocol="anthropic",
        server_template=server_template_for(kit.builder, requests),
        cold_checked=tuple(sorted({firsts[1], firsts[-1]})),  # the first that reuses, and the last
    )


def _claude_code_request(
    kit: PromptKit,
    label: str,
    messages: list[ChatMessage],
    tools: tuple[ToolSpec, ...],
    rng: random.Random,
    after_question: str,
) -> Request:
    """A conversation's first request: chatapp's prompt of `messages`, sent with a billing line of its own."""
    billing = f"x-anthropic-billing-header: cc_version=2.1.197.{rng.randrange(4096):03x}; cc_entrypoint=sdk-cli;"
    return Request(
        label,
        kit.build(messages, tools),
        messages=tuple(messages),
        tools=tools,
        billing_line=billing,
        after_question=after_question,
    )


def _context_for(tokens: int) -> int:
    """A context that holds `tokens` and an answer: the next multiple of 1,024 past them."""
    return (tokens // 1024 + 2) * 1024


def _agent_step(
    kit: PromptKit,
    agent: AgentTexts,
    tools: tuple[ToolSpec, ...],
    history: list[ChatMessage],
    prompt: tuple[int, ...],
    client: int,
    number: int,
    tokens: int,
) -> list[ChatMessage]:
    """A step's call (an assistant message of one call, as clients send it) and its result (a tool message).

    The step adds about `tokens` to the prompt: the call, the template's text around the result, the output.
    """
    call = agent.call(client, number)
    calling = ChatMessage(Role.ASSISTANT, ("",), tool_calls=(call,))
    empty = ChatMessage(Role.TOOL, (), results=(ToolResult(call.id, call.name, ""),))
    framing = len(kit.builder.with_tools(tools).build([*history, calling, empty])) - len(prompt)
    result = agent.result(client, number, call, tokens - framing)
    return [calling, ChatMessage(Role.TOOL, (), results=(result,))]


BUILDERS = {
    "A": workload_a,
    "B": workload_b,
    "C": workload_c,
    "D": workload_d,
    "E": workload_e,
    "F": workload_f,
    CODER_NAME: workload_k,
    NEW_CONVERSATIONS_NAME: workload_j,
}


def build_workloads(model_path: Path, scale: Scale, names: tuple[str, ...] = WORKLOAD_NAMES) -> list[Workload]:
    kit = PromptKit(model_path)
    try:
        built = [BUILDERS[name](kit, scale) for name in names]
        return [
            replace(
                workload,
                requests=tuple(
                    replace(request, boundaries=kit.boundaries.get(request.tokens, ())) for request in workload.requests
                ),
            )
            for workload in built
        ]
    finally:
        kit.close()
