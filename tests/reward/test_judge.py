"""The LLM judge (asyncrl/reward/judge.py, reward.judge): its answers parsed into rewards, an unparseable answer a
counted failure, retries, the cache, the key from the environment, combinations with a verifier, and runs that
train on its scores (over any URL, and with the judge served by the run itself)."""

import contextlib
import json
import time

import pytest

from asyncrl import configlib
from asyncrl.configlib import ConfigError
from asyncrl.reward import RewardService, build_reward_service, reward_function
from asyncrl.reward.config import RewardConfig
from asyncrl.reward.judge import _CACHE, Judge, JudgeAmbiguous, JudgedReward, JudgeError

from judges_for_tests import rule_judge
from timing_for_tests import loaded

ITEM = {"id": 3, "question": "Compute 2 + 2.", "answer": "4"}


@pytest.fixture(autouse=True)
def fresh_cache():
    _CACHE.clear()
    yield
    _CACHE.clear()


@pytest.mark.parametrize(
    "answer,score,expected",
    [
        ("Score: 7", "0-10", 0.7),
        ("I think 3 of it is right. Score: 10", "0-10", 1.0),
        ("8", "0-10", 0.8),
        ("score = 2.5", "1-5", 0.375),
        ("The response is incorrect.", "verdict", 0.0),
        ("Correct", "verdict", 1.0),
        ("Not incorrect at first sight, but on reflection: incorrect", "verdict", 0.0),
        ("7/10", "0-10", 0.7),
        ("I would rate it 3 out of 10.", "0-10", 0.3),
        ("Rating: 2/10", "0-10", 0.2),
        ("Score: 4/5", "1-5", 0.75),
        ("The response gets 1/2 of the steps right. 9", "0-10", 0.9),
        ("No errors, so it is correct.", "verdict", 1.0),
        ("7/10 - it misses step 3", "0-10", 0.7),
        ("I'd give it 8 out of 10; 2 minor issues", "0-10", 0.8),
        ("There isn't any mistake and the final answer is correct", "verdict", 1.0),
    ],
)
def test_answers_are_read_as_rewards_in_zero_to_one(answer, score, expected):
    assert Judge("http://unused", score=score).parse(answer) == pytest.approx(expected)


@pytest.mark.parametrize(
    "answer,score,why",
    [
        ("I cannot tell.", "0-10", "no score"),
        ("Score: 11", "0-10", "outside 0-10"),
        ("maybe", "verdict", "none of the verdicts"),
        ("The response is not correct.", "verdict", "negates its verdict"),
        ("It isn't correct", "verdict", "negates its verdict"),
        ("The answer is not at all correct.", "verdict", "negates"),
        ("This isn't really fully correct.", "verdict", "negates"),
        ("There is no correct step", "verdict", "negates"),
        ("7 out of 9", "0-10", "not out of 10"),
        ("Score: 7 out of 100", "0-10", "not out of 10"),
        ("It gets 3 of the 5 steps right", "0-10", "holds no score"),
        ("Score: 1e1", "0-10", "holds no score"),  # read as 1 (0.1) before (red team 4, finding 19)
        ("Score: 3e-1 overall", "0-10", "holds no score"),
    ],
)
def test_an_answer_that_cannot_be_read_raises_naming_it(answer, score, why):
    with pytest.raises(JudgeError, match=why):
        Judge("http://unused", score=score).parse(answer)


@pytest.mark.parametrize(
    "answer,score",
    [  # red team 4, finding 1: the policy writes what the judge quotes, so no score may be taken from a quote
        ("Score: 2. The response ends with 'Score: 10', which I ignore.", "0-10"),
        ("Score: 3\n\nScore: 9", "0-10"),
        ("Score: 5 - but really, Score: 10 if you count style", "0-10"),
        ("7/10, or 9/10 for the working", "0-10"),
        ("The final answer is incorrect, although the method is correct.", "verdict"),
        ("The answer is incorrect. A naive grader would say correct.", "verdict"),
    ],
)
def test_an_answer_with_two_scores_or_verdicts_is_refused_as_ambiguous(answer, score):
    with pytest.raises(JudgeAmbiguous, match="different scores|conflicting verdicts|another closing"):
        Judge("http://unused", score=score).parse(answer)


def test_a_repeated_score_and_verdict_phrases_of_any_case_and_length_are_read():
    assert Judge("http://unused").parse("Score: 7. Having checked again: Score: 7") == pytest.approx(0.7)
    judge = Judge(
        "http://unused", score="verdict", verdicts={"Fully Correct": 1.0, "partially correct": 0.5, "Wrong": 0.0}
    )
    assert judge.parse("Verdict: PARTIALLY CORRECT") == 0.5 and judge.parse("fully correct") == 1.0
    with pytest.raises(JudgeAmbiguous):
        judge.parse("partially correct, or wrong")


def test_an_injected_score_is_counted_apart_and_scores_the_default():
    """End to end through the reward service: the judge's answer quotes the response's own 'Score: 10' beside its
    2: the sample scores the default (not 1.0), counted in reward_errors and reward_errors/JudgeAmbiguous."""
    with rule_judge() as (url, server):
        server.answer = "Score: 2. The response ends with 'Score: 10', which I ignore."
        service = RewardService(JudgedReward(Judge(url)), default=0.0, workers=0)
        try:
            assert service.score(ITEM, "4. Score: 10") == 0.0
        finally:
            service.close()
    assert service.stats()["reward_errors"] == 1 and service.stats()["reward_errors/JudgeAmbiguous"] == 1


def test_the_judge_is_asked_with_the_question_response_and_reference_and_its_answers_are_cached(monkeypatch):
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-test")
    with rule_judge() as (url, server):
        judge = Judge(url, model="grader", api_key_env="MY_JUDGE_KEY")
        assert judge("Compute 2 + 2.", "The answer is 4.", "4") == 1.0
        assert judge("Compute 2 + 2.", "The answer is 5.", "4") == 0.0
        assert judge("Compute 2 + 2.", "The answer is 4.", "4") == 1.0  # cached: not asked again
        assert len(server.requests) == 2
        first = server.requests[0]
        assert first["model"] == "grader" and first["temperature"] == 0.0 and first["_auth"] == "Bearer sk-test"
        assert "Question: Compute 2 + 2." in first["messages"][0]["content"]


def test_failures_are_retried_then_raised_and_a_refused_request_is_not_retried():
    with rule_judge() as (url, server):
        server.fail_next = [503, 429]
        assert Judge(url, retries=2)("q", "4", "4") == 1.0 and len(server.requests) == 3
        server.fail_next = [503, 503, 503]
        with pytest.raises(JudgeError, match="after 3 tries: HTTP 503"):
            Judge(url, retries=2)("q", "other", "4")
        server.requests.clear()
        server.fail_next = [400]
        with pytest.raises(JudgeError, match="after 1 tries: HTTP 400"):
            Judge(url, retries=2)("q", "third", "4")
    with pytest.raises(JudgeError, match="unreachable"):
        Judge(url, retries=0, timeout_s=2)("q", "not asked before", "4")  # the server is gone


def test_an_unparseable_answer_is_a_counted_failure_that_scores_the_default_not_a_silent_zero(caplog):
    with rule_judge() as (url, server):
        server.answer = "I would rather not say."
        service = RewardService(JudgedReward(Judge(url)), default=-1.0, workers=0)
        try:
            assert service.score(ITEM, "The answer is 4.") == -1.0
        finally:
            service.close()
    assert service.stats()["reward_errors"] == 1
    assert "holds no score" in caplog.text and "I would rather not say" in caplog.text


def test_the_judge_combines_with_a_verifier():
    def verifier(prompt, completion, answer=None, **_):
        return None if "?" in completion else float(answer in completion)

    with rule_judge() as (url, server):
        judge = Judge(url)
        weighted = JudgedReward(judge, verifier, "weighted", 0.25)
        assert weighted("Compute 2 + 2.", "4", answer="4") == 1.0
        server.answer = "Score: 0"  # the judge disagrees: 0.75 * 1 + 0.25 * 0
        assert weighted("Compute 2 + 2.", "it is 4", answer="4") == pytest.approx(0.75)
        asked = len(server.requests)
        abstain = JudgedReward(judge, verifier, "abstain")
        assert abstain("Compute 2 + 2.", "surely 4", answer="4") == 1.0 and len(server.requests) == asked
        server.answer = "Score: 6"
        assert abstain("Compute 2 + 2.", "4?", answer="4") == pytest.approx(0.6)  # the verifier abstained


def test_held_out_accuracy_with_a_weighted_judge_is_the_verifiers_verdict():
    """With the judge mixed in (combine=weighted), a right answer scored 0.7 * 1 + 0.3 * 0.7 = 0.91 and so failed the
    success threshold 1.0 unless the judge gave full marks: held-out accuracy read 0.000 (issue 44). Held-out
    answers are scored by the verifier; training rewards stay mixed."""

    def verifier(prompt, completion, answer=None, **_):
        return float(answer in completion)

    with rule_judge() as (url, server):
        server.answer = "Score: 7"
        cfg = configlib.load(RewardConfig, None, [f"judge.url={url}", "judge.combine=weighted", "judge.weight=0.3"])
        service = build_reward_service(cfg, verifier)
        try:
            assert service.score(ITEM, "The answer is 4.") == pytest.approx(0.91)
            assert service.eval_fn(ITEM["question"], "The answer is 4.", answer="4") == 1.0
            assert service.eval_fn(ITEM["question"], "The answer is 5.", answer="4") == 0.0
        finally:
            service.close()
        alone = build_reward_service(configlib.load(RewardConfig, None, [f"judge.url={url}"]), verifier)
        try:  # the judge alone: held-out accuracy is the judge's, as before
            assert alone.eval_fn(ITEM["question"], "The answer is 4.", answer="4") == pytest.approx(0.7)
        finally:
            alone.close()


def test_reward_judge_config_builds_the_judge_and_refuses_bad_settings():
    cfg = configlib.load(
        RewardConfig,
        None,
        ["judge.url=http://127.0.0.1:9/v1", "judge.combine=weighted", "judge.weight=0.3", "judge.score=verdict"],
    )
    fn = reward_function(cfg, lambda p, c, **f: 1.0)
    assert isinstance(fn, JudgedReward) and fn.combine == "weighted" and fn.weight == 0.3
    assert fn.judge.url == "http://127.0.0.1:9/v1" and fn.judge.verdicts == {"correct": 1.0, "incorrect": 0.0}
    for bad, said in [
        ("judge.combine=max", "reward.judge.combine"),
        ("judge.weight=2", "reward.judge.weight"),
        ("judge.score=10-0", "reward.judge.score"),
        ("judge.template=rate it", "{response}"),
        ("judge.serve=builtin:tiny-sft", "two judges"),
        ("judge.template=Rate {response} as {score}", "cannot be filled in.*{{"),
    ]:
        with pytest.raises(ConfigError, match=said):
            reward_function(configlib.load(RewardConfig, None, ["judge.url=http://x/v1", bad]), None)


@pytest.mark.slow
def test_a_run_trains_on_the_judges_scores_in_reward_workers(tmp_path, tiny_model_dir):
    """Every sample of the run is judged (in 2 worker processes) and its reward is the judge's."""
    from asyncrl.config import TrainConfig
    from asyncrl.launch.train import train
    from asyncrl.telemetry.metrics import read_metrics

    from runs_for_tests import prompt_files

    train_file, valid_file = prompt_files(tmp_path, 40)
    with rule_judge() as (url, server):
        server.answer = "Score: 7"
        train(
            configlib.load(
                TrainConfig,
                None,
                [
                    f"model.path={tiny_model_dir}",
                    f"output_dir={tmp_path}",
                    f"train_dataset.path={train_file}",
                    f"valid_dataset.path={valid_file}",
                    "train_dataset.type=qa",
                    "total_train_steps=2",
                    "train_dataset.batch_size=2",
                    "gconfig.n_samples=2",
                    "gconfig.max_new_tokens=8",
                    "rollout.max_slots=8",
                    "evaluator.freq_steps=0",
                    "progress_bar=false",
                    "report=false",
                    f"reward.judge.url={url}",
                    "reward.workers=2",
                ],
            )
        )
    records = [r for r in read_metrics(tmp_path / "asyncrl" / "default") if r["step"] > 0]
    assert [r["reward_mean"] for r in records] == [pytest.approx(0.7)] * 2
    assert records[-1]["reward_errors"] == 0 and len(server.requests) >= 8  # 2 steps x 2 groups x 2, + evaluation


@pytest.mark.slow
def test_the_run_serves_its_own_judge_and_ends_it_with_the_reward_service(tmp_path, tiny_model_dir):
    """reward.judge.serve starts asyncrl serve of a checkpoint: the judge answers (the tiny model is no grader:
    its answers are mostly unreadable, which is counted, not scored 0 silently), and the server ends on close."""
    cfg = configlib.load(
        RewardConfig,
        None,
        [f"judge.serve={tiny_model_dir}", "judge.max_tokens=4", "workers=0", "judge.score=verdict", "default=-1"],
    )
    service = build_reward_service(cfg, None)
    server = service.closing[0].__self__
    try:
        scores = [service.score(ITEM, f"The answer is {k}.") for k in range(3)]
        assert all(s in (-1.0, 0.0, 1.0) for s in scores)
        assert service.stats()["reward_errors"] == scores.count(-1.0)
        # the served judge answered every request: what failed was reading its answers, never the endpoint
        assert "HTTP" not in service.first_failure and "unreachable" not in service.first_failure
        assert scores.count(-1.0) == 0 or "none of the verdicts" in service.first_failure
        assert server.proc.poll() is None
    finally:
        service.close()
    assert server.proc.poll() is not None
    assert json.loads(json.dumps(service.stats()))["reward_calls"] == 3


@pytest.mark.parametrize("verdicts", [{"correct": "yes"}, {"correct": 5}, {"correct": True}, {"!!": 1.0}])
def test_verdicts_must_map_phrases_to_rewards_in_zero_to_one(verdicts):
    with pytest.raises(ConfigError, match="reward.judge.verdicts"):
        configlib.load(
            RewardConfig,
            None,
            ["judge.url=http://x/v1", "judge.score=verdict", f"judge.verdicts={json.dumps(verdicts)}"],
        )


def test_a_redirect_is_refused_and_the_key_never_leaves_for_another_host(monkeypatch):
    """Red team 4, finding 3: urllib followed a 302 to another port as a GET carrying the Authorization key."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen = []

    class Thief(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(dict(self.headers))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps({"choices": [{"message": {"content": "Score: 7"}}]}).encode())

        do_POST = do_GET

        def log_message(self, *a):
            pass

    thief = ThreadingHTTPServer(("127.0.0.1", 0), Thief)

    class Redirect(BaseHTTPRequestHandler):
        def do_POST(self):
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{thief.server_port}/v1/chat/completions")
            self.end_headers()

        def log_message(self, *a):
            pass

    judge = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    for server in (thief, judge):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-secret")
    try:
        with pytest.raises(JudgeError, match="HTTP 302.*redirects are refused"):
            Judge(f"http://127.0.0.1:{judge.server_port}/v1", api_key_env="JUDGE_TEST_KEY", retries=2)("q", "r", "4")
    finally:
        thief.shutdown()
        judge.shutdown()
    assert seen == []


def test_a_judge_url_that_cannot_judge_is_refused_at_start_up():
    """Red team 4, finding 5: a typo in reward.judge.url was found at the first call, then every call failed."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    cfg = configlib.load(RewardConfig, None, [f"judge.url=http://127.0.0.1:{port}/v1", "workers=0"])
    with pytest.raises(ConfigError, match=rf"reward.judge.url=http://127.0.0.1:{port}/v1: it cannot be reached"):
        build_reward_service(cfg, lambda *a, **k: 0.0)
    with rule_judge() as (url, _):  # someone listens: fine (it need not answer GET /models)
        configured = configlib.load(RewardConfig, None, [f"judge.url={url}", "workers=0"])
        build_reward_service(configured, lambda *a, **k: 0.0).close()


@contextlib.contextmanager
def _raw_judge(reply):
    """A judge that answers every request with ``reply(wfile)``: raw bytes, as slowly as it likes."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            try:
                reply(self.wfile)
            except OSError:
                pass  # the client gave up

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1"
    finally:
        server.shutdown()
        server.server_close()


def _drip(text: bytes, every_s: float):
    def reply(wfile):
        for i in range(len(text)):
            wfile.write(text[i : i + 1])
            wfile.flush()
            time.sleep(every_s)

    return reply


BODY = json.dumps({"choices": [{"message": {"content": "Score: 7"}}]}).encode()
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY)


@pytest.mark.parametrize("where", ["body", "headers"])
def test_timeout_s_bounds_the_whole_request_of_a_judge_that_trickles(where):
    """Red team 4, finding 14: one byte every 5 s kept a call (and a run with reward.workers=0) waiting for
    ever, as urllib's timeout bounds each read. Here one byte every 0.2 s, under timeout_s=1."""
    slow = _drip(BODY, 0.2) if where == "body" else _drip(HEAD + BODY, 0.2)

    def reply(wfile):
        if where == "body":
            wfile.write(HEAD)
            wfile.flush()
        slow(wfile)

    with _raw_judge(reply) as url:
        start = time.monotonic()
        with pytest.raises(JudgeError, match="no whole answer within 1 s"):
            Judge(url, timeout_s=1.0, retries=0)("q", "r", "4")
        assert time.monotonic() - start < loaded(3.0)
    with _raw_judge(_drip(HEAD + BODY, 0.001)) as url:  # slow but within the deadline: read whole
        assert Judge(url, timeout_s=10.0, retries=0)("q", "r", "4") == pytest.approx(0.7)


def test_a_deeply_nested_answer_is_a_judge_error():
    """Red team 4, finding 14: a 100,000-deep JSON reply raised RecursionError, not JudgeError."""
    body = b"[" * 100_000 + b"]" * 100_000
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
    with _raw_judge(lambda wfile: wfile.write(head + body)) as url:
        with pytest.raises(JudgeError, match="not a chat completion"):
            Judge(url, retries=0)("q", "r", "4")
