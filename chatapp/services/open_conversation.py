"""The conversation a chat has open: the list it is chosen from, the branch on screen, and moving around
its tree (siblings, roots). Quick database reads, on the caller's thread."""

from __future__ import annotations

from collections.abc import Callable

from chatapp.errors import ChatappError
from chatapp.prompting.prompt import PromptBuilder
from chatapp.records import ConversationRecord, MessageRecord, PersonaRecord
from chatapp.services.answer_shape import shown_text
from chatapp.services.branches import BranchMessage, BranchView
from chatapp.store.conversations import ConversationStore
from chatapp.vocabulary import Role

NEW_TITLE = "New conversation"


class OpenConversation:
    """Which conversation is open, and the views of it the screens show."""

    def __init__(
        self,
        conversations: ConversationStore,
        display_builder: Callable[[], PromptBuilder | None],
        forget: Callable[[int], object] = lambda conversation_id: None,
    ) -> None:
        """`display_builder`: the answering model's prompt builder (a gpt-oss answer shows its reply only);
        `forget`: removes from the cache what only a conversation about to be deleted used."""
        self.conversations = conversations
        self.conversation_id: int | None = None
        self._display_builder = display_builder
        self._forget = forget

    def list_conversations(self, query: str = "") -> list[ConversationRecord]:
        return self.conversations.list_conversations(query)

    def new_conversation(self, persona: PersonaRecord | None = None) -> BranchView:
        record = self.conversations.create_conversation(NEW_TITLE)
        self.conversations.add_root(
            record.id,
            persona_name=persona.name if persona else None,
            persona_prompt=persona.prompt if persona else "",
            document_id=None,
        )
        return self.open(record.id)

    def open(self, conversation_id: int) -> BranchView:
        self.conversation_id = conversation_id
        return self.view()

    def open_latest_or_new(self) -> BranchView:
        existing = self.list_conversations()
        return self.open(existing[0].id) if existing else self.new_conversation()

    def view(self) -> BranchView:
        """The open branch, root to active leaf."""
        conversation = self.record()
        leaf_id = conversation.active_leaf_id
        if leaf_id is None:
            roots = self.conversations.roots(conversation.id)
            root = (
                roots[-1]
                if roots
                else self.conversations.add_root(
                    conversation.id, persona_name=None, persona_prompt="", document_id=None
                )
            )
            leaf_id = root.id
        path = self.conversations.path(leaf_id)
        root = path[0]
        roots = self.conversations.roots(conversation.id)
        builder = self._display_builder()
        messages = []
        for record in path[1:]:
            siblings = self.conversations.siblings(record.id)
            position = next(index for index, sibling in enumerate(siblings) if sibling.id == record.id)
            shown = shown_text(record.content, builder) if record.role is Role.ASSISTANT else record.content
            messages.append(BranchMessage(record, position + 1, len(siblings), shown))
        document = self.conversations.get_document(root.document_id) if root.document_id else None
        root_position = next(index for index, other in enumerate(roots) if other.id == root.id) + 1
        return BranchView(conversation, root, root_position, len(roots), document, tuple(messages))

    def tree(self) -> list[MessageRecord]:
        """Every message of the open conversation, for the branch tree."""
        return self.conversations.messages(self.record().id)

    def document_names(self) -> dict[int, str]:
        """Names of the documents the open conversation's roots are about, for the tree."""
        roots = self.conversations.roots(self.record().id)
        ids = {root.document_id for root in roots if root.document_id is not None}
        return {document_id: self.conversations.get_document(document_id).name for document_id in ids}

    def rename(self, title: str) -> None:
        self.conversations.rename(self.record().id, title.strip())

    def delete(self, conversation_id: int) -> None:
        """Delete the conversation, and from the cache what only it used (in effect its text)."""
        self._forget(conversation_id)
        self.conversations.delete(conversation_id)
        if conversation_id == self.conversation_id:
            self.conversation_id = None

    def set_qa_mode(self, on: bool) -> None:
        self.conversations.set_qa_mode(self.record().id, on)

    def record(self) -> ConversationRecord:
        """The open conversation's record; ChatappError when none is open."""
        if self.conversation_id is None:
            raise ChatappError("no conversation is open; press Ctrl+N to start one")
        return self.conversations.get_conversation(self.conversation_id)

    def switch_sibling(self, message_id: int, step: int) -> BranchView:
        siblings = self.conversations.siblings(message_id)
        index = next(i for i, sibling in enumerate(siblings) if sibling.id == message_id)
        target = siblings[max(0, min(len(siblings) - 1, index + step))]
        return self.jump_to(target.id)

    def jump_to(self, message_id: int) -> BranchView:
        """Open the branch through `message_id`, down its most recent answers."""
        leaf = self.conversations.latest_leaf(message_id)
        self.conversations.set_active_leaf(self.record().id, leaf.id)
        return self.view()

    def switch_root(self, persona_name: str | None, persona_prompt: str, document_id: int | None) -> BranchView:
        """Go to the root with this persona and document (made if new); a root left unused is dropped."""
        conversation = self.record()
        left = self.view().root
        for root in reversed(self.conversations.roots(conversation.id)):
            if root.content == persona_prompt and root.document_id == document_id and root.persona_name == persona_name:
                if root.id == left.id:
                    return self.view()  # already there: stay on the branch on screen
                self.jump_to(root.id)
                break
        else:
            self.conversations.add_root(
                conversation.id, persona_name=persona_name, persona_prompt=persona_prompt, document_id=document_id
            )
        self.conversations.discard_unused_root(left.id)
        return self.view()
