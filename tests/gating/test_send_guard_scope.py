"""The send guard acts only on the provider's requests (lane_plugin.gating.provider_requests): a gated body's web
fetch, vector store or Prefect API call is neither held during a pause, nor heard (its 429 pauses nothing, its
answer is not the probe's), nor the job's late send. Real openai SDK and plain httpx over HTTP, against the
emulator and a small local web server; gates outside a Prefect run; the ledger on SQLite and PostgreSQL."""

from __future__ import annotations

import contextvars
import http.server
import re
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from lane_plugin import current_gate, gate, report_usage
from lane_plugin.errors import InvalidInput
from lane_plugin.gating import get_ledger, provider_requests
from lane_plugin.testing import ProviderEmulator

pytestmark = pytest.mark.timeout(120)
PAUSE = 3.0  # long enough that a request not held is back well before its end on a loaded machine
CALL = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "word word"}]}


class _Site(http.server.BaseHTTPRequestHandler):
    """A website a gated body calls: ``/busy`` answers 429 ``retry-after: 30`` (as a rate-limited site does),
    ``/github`` a 429 with GitHub's bare ``x-ratelimit-*`` headers, ``/llm-busy`` a provider's 429
    (``x-ratelimit-remaining-requests: 0``, ``retry-after: 5``), anything else 200."""

    def do_GET(self) -> None:
        headers = {"content-length": "2"}
        code = 200
        if self.path.startswith("/busy"):
            code, headers["retry-after"] = 429, "30"
        elif self.path.startswith("/github"):
            code = 429
            headers.update({"retry-after": "30", "x-ratelimit-limit": "60", "x-ratelimit-remaining": "0"})
        elif self.path.startswith("/llm-busy"):
            code = 429
            headers.update(
                {"retry-after": "5", "x-ratelimit-limit-requests": "3", "x-ratelimit-remaining-requests": "0"}
            )
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(b"{}")

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def site():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def web():
    """A plain httpx client, made before any pause (making one loads TLS certificates: 0.3 s when loaded)."""
    with httpx.Client() as client:
        yield client


@pytest.fixture
def led(ledger_url, monkeypatch):
    monkeypatch.setattr(provider_requests, "_heard", {})  # no origin heard by an earlier test (a port reused)
    monkeypatch.setenv("LANE_DATABASE_URL", ledger_url)
    led = get_ledger(ledger_url)
    yield led
    led.close()


def _lane(led, name: str) -> str:
    led.set_lane(name, allowance=10**6, ceiling=10**6, max_leased=10)
    return name


def _paused(led, lane: str, g) -> None:
    """Another worker's 429 closes the lane for PAUSE seconds, after this gate's check before its body."""
    led.pause(lane, PAUSE, reason="another worker's 429", job_id=g.job_id)
    assert led.paused_for(lane) > PAUSE - 0.5


def test_a_websites_429_in_a_gated_body_does_not_pause_the_lane(led, site, web):
    lane = _lane(led, "web")
    with gate(stage="research", estimate=100, lane=lane, ledger=led) as g:
        assert web.get(f"{site}/busy/some-page").status_code == 429  # the site said: retry-after 30
        assert web.get(f"{site}/github/repos").status_code == 429  # bare x-ratelimit-*: not a provider's
        g.report(100)
    assert led.paused_for(lane) == 0.0
    assert led.rows("select rate_limited from job")[1] == [(0,)]


@pytest.mark.parametrize("client", ["httpx", "requests"])
def test_a_websites_429_raised_out_of_a_gated_body_does_not_pause_the_lane(led, site, web, client):
    # raise_for_status(): the body ends in the site's 429 (an httpx.HTTPStatusError, a requests.HTTPError), which
    # says nothing of the provider's window; the error is the body's own and goes on to the caller
    import requests

    lane = _lane(led, f"raised-{client}")
    fetch = web.get if client == "httpx" else requests.get
    errors = (httpx.HTTPStatusError, requests.HTTPError)
    with pytest.raises(errors, match="429"):
        with gate(stage="research", estimate=100, lane=lane, ledger=led):
            fetch(f"{site}/busy/some-page").raise_for_status()
    assert led.paused_for(lane) == 0.0
    # the same body meeting a provider's 429 (its rate-limit headers) pauses the lane, whichever client sent it
    with pytest.raises(errors, match="429"):
        with gate(stage="research", estimate=100, lane=lane, ledger=led):
            fetch(f"{site}/llm-busy").raise_for_status()
    assert 0.0 < led.paused_for(lane) <= 5.0  # the provider's retry-after


@pytest.mark.parametrize(
    "agent, held",
    [
        ("OpenAI/Python 1.99.0", True),
        ("AsyncAnthropic/Python 0.60.0", True),
        ("Lithic/Python 0.80.0", False),
        ("Togetherly/Python 2.0", False),  # a name that holds an LLM SDK's is not it
    ],
)
def test_a_stainless_sdks_request_is_the_providers_only_when_the_sdk_is_an_llm_providers(led, site, web, agent, held):
    # Stainless generates SDKs of payments, browser and cloud APIs too, with the same x-stainless-* headers: sent
    # during a pause, a payments API's request goes at once; an LLM SDK's waits for the reopen
    lane = _lane(led, "sdk-" + agent.split("/")[0].lower())
    sdk_headers = {"x-stainless-lang": "python", "x-stainless-retry-count": "0", "user-agent": agent}
    with gate(stage="s", estimate=100, lane=lane, ledger=led) as g:
        _paused(led, lane, g)
        left = led.paused_for(lane)
        t0 = time.monotonic()
        assert web.post(f"{site}/v1/charge", headers=sdk_headers).status_code == 200
        took = time.monotonic() - t0
        g.report(100)
    assert (took >= left - 0.05) is held, (took, left)


def test_an_sdks_rate_limit_error_is_the_providers_whatever_request_it_carries_and_an_aiohttp_sites_is_not(caplog):
    from types import SimpleNamespace

    # LiteLLM's RateLimitError subclasses openai's and carries a made-up request to a host no rule knows
    made_up = httpx.Request("POST", "https://cloud.google.com/vertex-ai/")
    litellm_like = type("RateLimitError", (openai.RateLimitError,), {})(
        "rate limited", response=httpx.Response(429, request=made_up), body=None
    )
    assert provider_requests.error_is_providers("any", litellm_like)
    # aiohttp's ClientResponseError: its request in request_info, its answer's headers on the error itself
    site = SimpleNamespace(url=httpx.URL("https://example.org/page"), headers={"user-agent": "Python/aiohttp"})
    aiohttp_like = type("ClientResponseError", (Exception,), {"status": 429, "request_info": site, "headers": {}})()
    assert not provider_requests.error_is_providers("any", aiohttp_like)
    # an answer built without a request (httpx's Response.request raises then): counted, and nothing logged
    bare = type("Http429", (Exception,), {"status_code": 429, "response": httpx.Response(429)})()
    with caplog.at_level("WARNING"):
        assert provider_requests.error_is_providers("any", bare)
    assert not [r for r in caplog.records if "not told" in r.getMessage()]


def test_an_llm_providers_public_api_host_is_the_providers_whatever_sends_to_it():
    plain = httpx.Client()
    for url, want in [
        ("https://api.openai.com/v1/chat/completions", True),
        ("https://my-deployment.openai.azure.com/openai/deployments/x", True),
        ("https://api.anthropic.com/v1/messages", True),
        ("https://api.lithic.com/v1/cards", False),
        ("https://example.org/openai.com", False),
        ("https://api.openai.com./v1/chat/completions", True),  # a fully qualified name's trailing dot
        ("https://evil-openai.azure.com.attacker.example/v1", False),
    ]:
        assert provider_requests.is_providers("any", httpx.Request("POST", url), plain) is want, url
    plain.close()


def test_during_a_pause_only_the_providers_request_is_held(led, site, web):
    lane = _lane(led, "hold")
    with ProviderEmulator(tpm=10**6, rpm=None, window_seconds=60, output_lengths=[5]) as emu:
        client = openai.OpenAI(base_url=emu.base_url, api_key="k", max_retries=0)
        with gate(stage="s", estimate=100, lane=lane, ledger=led) as g:
            _paused(led, lane, g)
            assert web.get(f"{site}/vector-db/search").status_code == 200
            web_left = led.paused_for(lane)  # the web request came back while the lane was still paused
            g.report(client.chat.completions.create(**CALL))
            sdk_left = led.paused_for(lane)
        recs = emu.records
    assert web_left > 1.0  # not held
    assert sdk_left == 0.0 and [r.status for r in recs] == [200]  # the SDK's request waited for the reopen
    assert led.pause_state(lane)[1] is None  # and was the probe: its 200 reopened the lane


def test_during_a_pause_the_anthropic_sdks_request_is_held_too(led):
    import anthropic

    lane = _lane(led, "claude")
    with ProviderEmulator(tpm=10**6, rpm=None, window_seconds=60, output_lengths=[5]) as emu:
        client = anthropic.Anthropic(base_url=emu.base_url.removesuffix("/v1"), api_key="k", max_retries=0)
        with gate(stage="s", estimate=100, lane=lane, ledger=led) as g:
            _paused(led, lane, g)
            g.report(client.messages.create(**CALL))
            left = led.paused_for(lane)
        recs = emu.records
    assert left == 0.0 and [r.status for r in recs] == [200]  # it waited for the reopen


def test_after_a_pause_a_websites_answer_is_not_the_probe(led, site, web):
    lane = _lane(led, "probe")
    with gate(stage="seed", estimate=10, lane=lane, ledger=led) as g0:
        led.pause(lane, 0.2, reason="a provider's 429", job_id=g0.job_id)
        g0.report(10)
    time.sleep(0.4)
    assert led.pause_state(lane)[1] is not None  # the pause ended with no request through: the probe's turn
    with ProviderEmulator(tpm=10**6, rpm=None, window_seconds=60, output_lengths=[5]) as emu:
        client = openai.OpenAI(base_url=emu.base_url, api_key="k", max_retries=0)
        with gate(stage="probe", estimate=10, lane=lane, ledger=led) as g:
            assert g._probe is not None  # this gate holds the probe
            assert web.get(f"{site}/vector-db/search").status_code == 200
            assert g._probe is not None and led.pause_state(lane)[1] is not None  # not spent by the web request
            g.report(client.chat.completions.create(**CALL))
            assert g._probe is None and led.pause_state(lane)[1] is None  # the provider's 200 reopened the lane


def test_a_websites_request_sent_late_does_not_move_the_jobs_charges(led, site, web):
    lane = "late-web"
    led.set_lane(lane, allowance=10**6, ceiling=10**6, max_leased=10, burst_tokens=10**5, window_seconds=60.0)
    charged_at = "select max(at) from rate_charge where job_id = :j"
    with gate(stage="s", estimate=60, rate_cost=50, lane=lane, ledger=led) as g:
        at = led._run(lambda cur, now: cur.scalar(charged_at, {"j": g.job_id}))
        time.sleep(0.3)  # past the late-send rule's 0.1 s
        assert web.get(f"{site}/vector-db/search").status_code == 200
        g.report(60)
    assert led._run(lambda cur, now: cur.scalar(charged_at, {"j": g.job_id})) == at


def test_a_plain_httpx_client_of_the_provider_is_the_providers_once_it_answered_with_rate_limit_headers(led):
    lane = _lane(led, "heard")
    with ProviderEmulator(tpm=10**6, rpm=None, window_seconds=60, output_lengths=[5]) as emu:
        raw = httpx.Client(base_url=emu.base_url, headers={"authorization": "Bearer k"})
        with gate(stage="s", estimate=100, lane=lane, ledger=led) as g:
            assert raw.post("/chat/completions", json=CALL).headers["x-ratelimit-remaining-tokens"]  # heard
            _paused(led, lane, g)
            raw.post("/chat/completions", json=CALL)
            left = led.paused_for(lane)
            g.report(100)
        raw.close()
    assert left == 0.0  # the second request of the plain client was held until the reopen


def test_a_429_with_a_providers_headers_pauses_the_lane_whatever_sent_it(led, site, web):
    lane = _lane(led, "proxy")
    with gate(stage="s", estimate=100, lane=lane, ledger=led) as g:
        assert web.get(f"{site}/llm-busy").status_code == 429  # x-ratelimit-remaining-requests: 0
        g.report(100)
    assert 0.0 < led.paused_for(lane) <= 5.0  # the provider's retry-after
    assert led.rows("select rate_limited from job")[1] == [(1,)]


def test_lane_provider_hosts_makes_a_hosts_requests_the_providers_but_never_prefects_api(led, site, web, monkeypatch):
    from prefect.client.base import PrefectHttpxSyncClient
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.setenv("LANE_PROVIDER_HOSTS", "llm.example.org, 127.0.0.1")  # the site is "the provider" here
    lane = _lane(led, "listed")
    took: dict[str, tuple[float, float]] = {}

    def send(what: str, request) -> None:  # how long the request took, and how long the pause had left then
        left, t0 = led.paused_for(lane), time.time()
        request()
        took[what] = (time.time() - t0, left)

    with gate(stage="s", estimate=100, lane=lane, ledger=led) as g:
        with temporary_settings({PREFECT_API_URL: f"{site}/api"}), PrefectHttpxSyncClient() as prefects:
            _paused(led, lane, g)
            send("prefect client", lambda: prefects.get(f"{site}/api/flow_runs/1"))
            send("under PREFECT_API_URL", lambda: web.get(f"{site}/api/artifacts/"))
            send("listed", lambda: web.get(f"{site}/v1/chat"))  # the listed host, not Prefect's API: held
        g.report(100)
    assert all(left > 0.5 for _, left in took.values())  # each request was sent during the pause
    assert took["prefect client"][0] < took["prefect client"][1]  # back before the pause's end: not held
    assert took["under PREFECT_API_URL"][0] < took["under PREFECT_API_URL"][1]
    assert took["listed"][0] >= took["listed"][1] - 0.05  # held until the reopen


def test_a_bad_lane_provider_hosts_is_refused_by_name_before_the_body(led, monkeypatch):
    monkeypatch.setenv("LANE_PROVIDER_HOSTS", "https://api.openai.com/v1")
    ran = []
    with pytest.raises(InvalidInput, match=r"LANE_PROVIDER_HOSTS.*not a host: write host, host:port or \*\.domain"):
        with gate(stage="s", estimate=10, lane="free", ledger=led):
            ran.append(1)
    assert ran == []


def test_a_lane_provider_hosts_made_bad_during_the_body_fails_no_request(led, site, web, monkeypatch, caplog):
    with gate(stage="s", estimate=10, lane=_lane(led, "later"), ledger=led) as g:
        monkeypatch.setenv("LANE_PROVIDER_HOSTS", "https://api.openai.com/v1")
        assert web.get(f"{site}/vector-db/search").status_code == 200
        g.report(10)
    assert any("passes unguarded" in r.getMessage() and "LANE_PROVIDER_HOSTS" in r.getMessage() for r in caplog.records)


def _fanout_example() -> str:
    """The fan-out example of docs/billing.md, as written there."""
    text = (Path(__file__).parents[2] / "docs" / "billing.md").read_text()
    block = re.search(r"( *)```python\n( *@lane_task\(stage=\"fanout\".*?)\n *```", text, re.S)
    assert block is not None
    return textwrap.dedent(block.group(2))


def test_the_docs_fanout_example_has_its_pool_threads_requests_held_during_a_pause(led):
    # The example's pool threads send while another worker's 429 has the lane paused: each request must wait.
    lane = _lane(led, "fanout")
    with ProviderEmulator(tpm=10**6, rpm=None, window_seconds=60, output_lengths=[5]) as emu:
        client = openai.OpenAI(base_url=emu.base_url, api_key="k", max_retries=0)
        until: list[float] = []

        def lane_task(stage: str, estimate):  # the example's decorator, outside a Prefect run
            def decorate(body):
                def run(docs):
                    with gate(stage=stage, estimate=estimate(docs), lane=lane, ledger=led) as g:
                        _paused(led, lane, g)
                        until.append(time.time() + led.paused_for(lane))
                        return body(docs)

                return run

            return decorate

        space = {"lane_task": lane_task, "client": client, "CALL": CALL, "ThreadPoolExecutor": ThreadPoolExecutor}
        space.update({"contextvars": contextvars, "report_usage": report_usage, "current_gate": current_gate})
        exec(_fanout_example().replace("create(...)", "create(**CALL)"), space)
        answers = space["fanout"](["a", "b", "c"])
        offset = time.time() - emu.clock() + emu.t0  # time.time() less the emulator's seconds since its start
        sent = [r.t + offset for r in emu.records]
    assert len(answers) == 3 and len(sent) == 3
    assert min(sent) >= until[0] - 0.05  # no request of the pool's threads reached the provider during the pause
