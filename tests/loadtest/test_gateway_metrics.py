"""The voice bench's reading of the gateway's /metrics: deadline miss rates, step wall vs CPU, the
clock's waits, the event loop's lag and the process's CPU, from two scrapes of a real registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from loadtest.bench.gateway_metrics import parse, summarize

BUCKETS = (0.001, 0.01, 0.1, 1.0)


def scrape_of(registry: CollectorRegistry) -> dict:
    return parse(generate_latest(registry).decode())


def test_a_level_is_read_from_the_difference_of_two_scrapes() -> None:
    reg = CollectorRegistry()
    step = Histogram("realtime_gw_worker_step_seconds", "", ["worker"], buckets=BUCKETS, registry=reg)
    cpu = Histogram("realtime_gw_worker_step_cpu_seconds", "", ["worker"], buckets=BUCKETS, registry=reg)
    wait = Histogram(
        "realtime_gw_device_clock_wait_seconds", "", ["stage", "device"], buckets=BUCKETS, registry=reg
    )
    lag = Histogram("realtime_gw_event_loop_lag_seconds", "", buckets=BUCKETS, registry=reg)
    frames = Counter("realtime_gw_stage_frames_total", "", ["stage", "device"], registry=reg)
    misses = Counter("realtime_gw_stage_deadline_misses_total", "", ["stage", "device"], registry=reg)
    process = Counter("process_cpu_seconds", "", registry=reg)
    frames.labels("asr-kyutai", "cuda:0").inc(500)  # before the level: not counted
    before = scrape_of(reg)
    for _ in range(10):
        step.labels("asr-kyutai").observe(0.05)
        cpu.labels("asr-kyutai").observe(0.04)
        wait.labels("asr-kyutai", "cuda:0").observe(0.005)
    lag.observe(0.0005)
    lag.observe(0.05)
    frames.labels("asr-kyutai", "cuda:0").inc(1000)
    misses.labels("asr-kyutai", "cuda:0").inc(3)
    frames.labels("tts-qwen3", "cuda:0").inc(1000)
    misses.labels("tts-qwen3", "cuda:0").inc(0)
    process.inc(2.0)
    level = summarize(before, scrape_of(reg), wall_s=2.0)
    assert level["deadlines"]["asr-kyutai"] == {"frames": 1000, "missed": 3, "miss_rate": 0.003}
    assert level["deadlines"]["tts-qwen3"]["miss_rate"] == 0.0
    assert level["deadline_miss_rate"] == 0.0015
    asr = level["steps"]["asr-kyutai"]
    assert asr["steps"] == 10 and 10 < asr["p50_ms"] <= 100
    assert asr["busy"] == 0.25 and asr["cpu_over_wall"] == 0.8  # 0.5 s of steps in 2 s; 0.4 s of CPU
    assert level["device_busy"] == 0.25
    assert 1 < level["clock_wait"]["asr-kyutai"]["p95_ms"] <= 10
    assert level["event_loop_lag"]["p99_ms"] > 10
    assert level["gateway_cpu_cores"] == 1.0
