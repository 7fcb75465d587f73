"""Models the sync tests register: articles indexed per tenant when published (with their
author's name and tags in the text), and notes in one fixed collection."""

from django.db import models

import django_rag as rag


class Author(models.Model):
    name = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.name


class Tag(models.Model):
    name = models.CharField(max_length=50)

    def __str__(self) -> str:
        return self.name


def _visible(user, rows):
    # Row-level visibility below collections: a user sees their tenant's articles only.
    return rows.filter(tenant=getattr(user, "first_name", ""))


@rag.indexed(
    text="index_text",
    title="title",
    metadata=["tenant", "published_on"],
    collection=lambda article: f"articles-{article.tenant}",
    where={"published": True},
    m2m=["tags"],
    related={Author: lambda author: author.articles.all()},
    visible=_visible,
)
class Article(models.Model):
    tenant = models.CharField(max_length=20, default="acme")
    title = models.CharField(max_length=200)
    body = models.TextField()
    published = models.BooleanField(default=True)
    published_on = models.DateField(null=True, blank=True)
    author = models.ForeignKey(
        Author, null=True, blank=True, on_delete=models.SET_NULL, related_name="articles"
    )
    tags = models.ManyToManyField(Tag, blank=True, related_name="articles")

    def __str__(self) -> str:
        return self.title

    def index_text(self) -> str:
        parts = [self.title, self.body]
        if self.author_id:
            parts.append(f"Written by {self.author.name}.")
        tags = sorted(tag.name for tag in self.tags.all()) if self.pk else []
        if tags:
            parts.append("Tags: " + ", ".join(tags) + ".")
        return "\n\n".join(parts)


@rag.indexed(text=["body"], collection="notes", format="markdown")
class Note(models.Model):
    body = models.TextField(blank=True)

    def __str__(self) -> str:
        return self.body[:40]
