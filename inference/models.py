"""What the API itself keeps in PostgreSQL: the Responses API's stored responses, and the
Conversations API's conversations and their items."""

from __future__ import annotations

from django.db import models

from tenants.models import Tenant


class StoredResponse(models.Model):
    """One response of `POST /v1/responses` with `store` true, kept so any frontend can
    answer `GET`, chain a later turn on it (`previous_response_id`) or list its input.

    Its text (the input items, the output, instructions and metadata) is sealed with the
    content keys like any other text the platform keeps; the columns hold only what finding
    it needs. `previous_id` is not a foreign key: a deleted previous response ends the chain
    (a 404 for the turn that names it), as OpenAI's does.
    """

    id = models.CharField(max_length=64, primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="responses")
    request_id = models.CharField(max_length=64, unique=True)
    previous_id = models.CharField(max_length=64, blank=True, default="")
    status = models.CharField(max_length=16)
    created_at = models.DateTimeField()
    # The tenant's retention period when it keeps text, else OpenAI's 30 days; the hourly
    # purge deletes it after, and reads never return it.
    expires_at = models.DateTimeField(db_index=True)
    sealed = models.BinaryField()
    # The bytes it holds (its sealed text): the tenant's stored responses and conversations
    # are bounded together (ROUNDHOUSE_TENANT_STORED_BYTES, inference.responses.store).
    size = models.BigIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["tenant", "created_at"])]

    def __str__(self) -> str:
        return self.id


class Conversation(models.Model):
    """A conversation of the Conversations API: items a client keeps on the platform, which a
    response naming it (`conversation`) reads as its history and adds its turn to.

    Its metadata and its items' text are sealed like every text the platform keeps. It lives
    for the tenant's retention period (else 30 days) after its last change.
    """

    id = models.CharField(max_length=64, primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="conversations")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)
    next_position = models.IntegerField(default=0)
    sealed = models.BinaryField()
    size = models.BigIntegerField(default=0)  # its sealed metadata's bytes; items count their own

    class Meta:
        indexes = [models.Index(fields=["tenant", "created_at"])]

    def __str__(self) -> str:
        return self.id


class ConversationItem(models.Model):
    """One item of a conversation, in the order it was added; its id is the conversation's
    own (unique within it)."""

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="items")
    position = models.IntegerField()
    item_id = models.CharField(max_length=64)
    sealed = models.BinaryField()
    size = models.BigIntegerField(default=0)  # its sealed text's bytes

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["conversation", "position"], name="conversation_item_position"
            ),
            models.UniqueConstraint(
                fields=["conversation", "item_id"], name="conversation_item_id"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.conversation_id}/{self.item_id}"
