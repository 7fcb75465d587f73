"""Conversations with the documents: a thread of user and assistant messages."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Conversation(models.Model):
    """One chat thread, owned by a user or (anonymous chat) by a session key."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="rag_conversations",
    )
    # Anonymous chat: the Django session that started it (empty for a user's conversation).
    session_key = models.CharField(max_length=64, blank=True, default="", db_index=True)
    # The collection names every turn searches (None: every collection the caller may read).
    collections = models.JSONField(null=True, blank=True)
    title = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-pk"]
        indexes = [models.Index(fields=["owner", "-updated_at"], name="django_rag_conv_owner")]

    def __str__(self) -> str:
        return self.title or f"Conversation {self.pk}"


class Message(models.Model):
    """One turn of a conversation. An assistant message records what its answer used: the
    query actually searched, the chunks retrieved, the citations and the usage."""

    class Role(models.TextChoices):
        USER = "user", "User"
        ASSISTANT = "assistant", "Assistant"

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    text = models.TextField()
    # The standalone query retrieval searched with (the condensed follow-up, or the message).
    query = models.TextField(blank=True, default="")
    # Chunk references: [{"number", "chunk_id", "document_id", "source_id", "title", ...}].
    citations = models.JSONField(default=list, blank=True)
    # Ids of the chunks the answer was written from, in rank order.
    chunk_ids = models.JSONField(default=list, blank=True)
    usage = models.JSONField(default=dict, blank=True)
    # How the query was made: {"condensed": bool, "fallback": reason or None, "engine": ...}.
    retrieval = models.JSONField(default=dict, blank=True)
    token_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["conversation", "pk"]

    def __str__(self) -> str:
        return f"{self.role}: {self.text[:60]}"
