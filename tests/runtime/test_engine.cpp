// The dependency engine: hazards, overlap from the spans, the sequential schedule, errors and cancel.
#include <QtTest>

#include <atomic>
#include <chrono>
#include <thread>

#include "gpunodes/errors.h"
#include "gpunodes/ops.h"

using namespace gn;
using namespace std::chrono_literals;

namespace {

// An op that sleeps, then appends its id to a log; for ordering tests.
void push_logged(Engine& e, std::vector<int>& log, std::mutex& m, int id, std::chrono::milliseconds sleep,
                 std::vector<VarPtr> reads, std::vector<VarPtr> writes, Device d = Device::cpu(),
                 StreamKind s = StreamKind::Compute) {
  e.push(
      [&log, &m, id, sleep](OpContext&) {
        std::this_thread::sleep_for(sleep);
        std::lock_guard lock(m);
        log.push_back(id);
      },
      reads, writes, d, s, {"op" + std::to_string(id)});
}

bool overlap(const Span& a, const Span& b) { return a.start_us < b.end_us && b.start_us < a.end_us; }

// Two independent matmul chains, one per CPU device; returns the spans tagged "chain0" and "chain1".
std::pair<std::vector<Span>, std::vector<Span>> run_two_chains(Schedule schedule) {
  Runtime rt({.cpu_devices = 2, .schedule = schedule});
  // Both chains wait on one gate, so they become ready at the same moment, and each is long enough
  // (tens of ms) that a loaded machine still runs them side by side rather than one after the other.
  VarPtr gate = new_var();
  rt.engine().push([](OpContext&) { std::this_thread::sleep_for(20ms); }, {}, {gate}, Device::cpu(0),
                   StreamKind::Copy, {"gate"});
  for (int d = 0; d < 2; ++d) {
    ScopedOpTag tag("chain" + std::to_string(d));
    Tensor x = uniform(rt, {512, 512}, Device::cpu(d), d);
    rt.engine().push([](OpContext&) {}, {gate}, {x.var()}, Device::cpu(d), StreamKind::Compute, {"wait gate"});
    for (int i = 0; i < 6; ++i) x = scale_shift(matmul(x, x), 1e-3f, 0);
  }
  rt.engine().wait_all();
  std::pair<std::vector<Span>, std::vector<Span>> out;
  for (auto& s : rt.profiler().spans()) {
    if (s.name != "matmul") continue;
    (s.tag == "chain0" ? out.first : out.second).push_back(s);
  }
  return out;
}

}  // namespace

class EngineTest : public QObject {
  Q_OBJECT
 private slots:
  void read_after_write_waits_for_the_writer() {
    Runtime rt;
    std::vector<int> log;
    std::mutex m;
    VarPtr v = new_var();
    // The writer is slow and on another stream; the reader must still run after it.
    push_logged(rt.engine(), log, m, 1, 50ms, {}, {v}, Device::cpu(), StreamKind::Copy);
    push_logged(rt.engine(), log, m, 2, 0ms, {v}, {}, Device::cpu(), StreamKind::Compute);
    rt.engine().wait_all();
    QCOMPARE(log, (std::vector<int>{1, 2}));
  }

  void write_after_read_waits_for_readers() {
    Runtime rt;
    std::vector<int> log;
    std::mutex m;
    VarPtr v = new_var();
    push_logged(rt.engine(), log, m, 1, 50ms, {v}, {}, Device::cpu(), StreamKind::Copy);
    push_logged(rt.engine(), log, m, 2, 0ms, {}, {v}, Device::cpu(), StreamKind::Compute);
    rt.engine().wait_all();
    QCOMPARE(log, (std::vector<int>{1, 2}));
  }

  void independent_ops_on_two_streams_overlap() {
    Runtime rt;
    std::vector<int> log;
    std::mutex m;
    push_logged(rt.engine(), log, m, 1, 100ms, {}, {new_var()}, Device::cpu(), StreamKind::Copy);
    push_logged(rt.engine(), log, m, 2, 0ms, {}, {new_var()}, Device::cpu(), StreamKind::Compute);
    rt.engine().wait_all();
    QCOMPARE(log, (std::vector<int>{2, 1}));  // the fast op did not wait for the slow one
  }

  void wait_waits_only_for_the_var() {
    Runtime rt;
    std::vector<int> log;
    std::mutex m;
    VarPtr slow = new_var(), fast = new_var();
    push_logged(rt.engine(), log, m, 1, 300ms, {}, {slow}, Device::cpu(), StreamKind::Copy);
    push_logged(rt.engine(), log, m, 2, 0ms, {}, {fast}, Device::cpu(), StreamKind::Compute);
    rt.engine().wait(fast);
    {
      std::lock_guard lock(m);
      QCOMPARE(log, (std::vector<int>{2}));
    }
    rt.engine().wait(slow);
    QCOMPARE(log, (std::vector<int>{2, 1}));
  }

  void parallel_schedule_overlaps_two_devices() {
    auto [chain0, chain1] = run_two_chains(Schedule::Parallel);
    QCOMPARE(chain0.size(), size_t(6));
    QCOMPARE(chain1.size(), size_t(6));
    int overlapping = 0;
    for (auto& a : chain0)
      for (auto& b : chain1) overlapping += overlap(a, b);
    QVERIFY2(overlapping > 0, "no matmul span of device 0 overlapped one of device 1");
  }

  void sequential_schedule_does_not_overlap() {
    auto [chain0, chain1] = run_two_chains(Schedule::Sequential);
    QCOMPARE(chain0.size(), size_t(6));
    for (auto& a : chain0)
      for (auto& b : chain1) QVERIFY(!overlap(a, b));
  }

  void exception_surfaces_at_wait_and_poisons_dependents() {
    Runtime rt;
    VarPtr a = new_var(), b = new_var();
    std::atomic<bool> dependent_ran{false};
    rt.engine().push([](OpContext&) { throw Error("boom in op"); }, {}, {a}, Device::cpu(), StreamKind::Compute,
                     {"failing"});
    rt.engine().push([&](OpContext&) { dependent_ran = true; }, {a}, {b}, Device::cpu(), StreamKind::Compute,
                     {"dependent"});
    try {
      rt.engine().wait(b);
      QFAIL("expected the error at wait");
    } catch (const Error& e) {
      QCOMPARE(QString(e.what()), QString("boom in op"));
    }
    QVERIFY(!dependent_ran);
    QVERIFY_THROWS_EXCEPTION(Error, rt.engine().wait_all());
    rt.engine().wait_all();  // reported once
    // The engine is still usable, and rewriting the var clears the error.
    rt.engine().push([](OpContext&) {}, {}, {a}, Device::cpu(), StreamKind::Compute, {"rewrite"});
    rt.engine().wait(a);
  }

  void cancel_drops_queued_work_quickly() {
    Runtime rt;
    Tensor x = uniform(rt, {1500, 1500}, Device::cpu(), 1);
    auto ys = matmul_repeat(x, x, 200);  // tens of seconds of work on a small CPU
    std::this_thread::sleep_for(100ms);
    auto t0 = std::chrono::steady_clock::now();
    rt.engine().cancel();
    QVERIFY_THROWS_EXCEPTION(CancelledError, rt.engine().wait_all());
    auto waited = std::chrono::steady_clock::now() - t0;
    QVERIFY2(waited < 1s, "cancel took longer than a second");
    QVERIFY_THROWS_EXCEPTION(CancelledError, to_host(ys.back()));
    ys.clear();
    x = Tensor();
    rt.engine().reset_cancel();
    rt.engine().wait_all();
    QCOMPARE(rt.memory_stats(Device::cpu()).allocated_bytes.current, int64_t(0));  // nothing leaked
    QCOMPARE(item(sum(ones(rt, {4}, Device::cpu()))), 4.0f);  // usable again
  }

  void cancel_a_chain_of_200000_ops() {
    // Each op writes the one variable, so each waits for the one before: after the cancel they complete one
    // from the other without running. That cascade used to recurse once per op and overflow the stack
    // (MatMul's repeat goes up to a million).
    Runtime rt;
    VarPtr v = new_var();
    std::atomic<bool> release{false};
    std::atomic<int> ran{0};
    rt.engine().push(
        [&](OpContext&) {
          while (!release) std::this_thread::sleep_for(1ms);
        },
        {}, {v}, Device::cpu(), StreamKind::Compute, {"gate"});
    for (int i = 0; i < 200000; ++i)
      rt.engine().push([&](OpContext&) { ++ran; }, {}, {v}, Device::cpu(), StreamKind::Compute, {"link"});
    const auto t0 = std::chrono::steady_clock::now();
    rt.engine().cancel();
    release = true;
    QVERIFY_THROWS_EXCEPTION(CancelledError, rt.engine().wait_all());
    const auto took = std::chrono::steady_clock::now() - t0;
    QVERIFY2(took < 10s, "the cancelled chain took more than a few seconds to drain");
    QCOMPARE(ran.load(), 0);
    QCOMPARE(rt.engine().pending(), size_t(0));
  }

  void when_done_fires_once_the_tags_ops_are_complete() {
    Runtime rt;
    std::atomic<int> finished{0};
    std::atomic<bool> called{false};
    std::atomic<int> finished_at_call{-1};
    std::exception_ptr seen = std::make_exception_ptr(Error("not called"));
    {
      ScopedOpTag tag("node1");
      for (int i = 0; i < 3; ++i)
        rt.engine().push(
            [&finished](OpContext&) {
              std::this_thread::sleep_for(30ms);
              ++finished;
            },
            {}, {new_var()}, Device::cpu(), StreamKind::Compute, {"slow"});
    }
    rt.engine().when_done("node1", [&](const TagOutcome& o) {
      finished_at_call = finished.load();
      seen = o.error;
      called = true;
    });
    rt.engine().wait_all();
    QVERIFY2(called, "wait_all returned before the when_done callback was made");
    QCOMPARE(finished_at_call.load(), 3);  // every op of the tag had run, whichever thread called
    QVERIFY(!seen);
    // A tag with nothing pending (or never used) answers at once, on this thread.
    bool at_once = false;
    rt.engine().when_done("node1", [&](const TagOutcome& o) { at_once = !o.error; });
    QVERIFY(at_once);
    at_once = false;
    rt.engine().when_done("never-used", [&](const TagOutcome&) { at_once = true; });
    QVERIFY(at_once);
  }

  void when_done_tells_own_errors_from_inherited_ones() {
    Runtime rt;
    VarPtr a = new_var(), b = new_var();
    {
      ScopedOpTag tag("producer");
      rt.engine().push([](OpContext&) { throw Error("boom in producer"); }, {}, {a}, Device::cpu(),
                       StreamKind::Compute, {"failing"});
    }
    {
      ScopedOpTag tag("consumer");
      rt.engine().push([](OpContext&) {}, {a}, {b}, Device::cpu(), StreamKind::Compute, {"dependent"});
    }
    QVERIFY_THROWS_EXCEPTION(Error, rt.engine().wait_all());
    // Both already finished: the failure was kept until asked for, then forgotten.
    TagOutcome producer, consumer;
    rt.engine().when_done("producer", [&](const TagOutcome& o) { producer = o; });
    rt.engine().when_done("consumer", [&](const TagOutcome& o) { consumer = o; });
    QVERIFY(producer.error && !producer.from_input);
    QVERIFY(consumer.error && consumer.from_input);
    QVERIFY(producer.error == consumer.error);  // the same exception, passed along
    TagOutcome again{std::make_exception_ptr(Error("stale"))};
    rt.engine().when_done("producer", [&](const TagOutcome& o) { again = o; });
    QVERIFY(!again.error);
  }

  void blocking_reads_are_marked_in_the_trace() {
    Runtime rt;
    Tensor x = ones(rt, {10, 10}, Device::cpu());
    for (int i = 0; i < 3; ++i) (void)item(frobenius_norm(matmul(x, x)));
    int reads = 0;
    for (auto& s : rt.profiler().spans()) reads += s.host_blocking;
    QCOMPARE(reads, 3);
    QString trace = QString::fromStdString(rt.profiler().chrome_trace_json());
    QJsonParseError err;
    auto doc = QJsonDocument::fromJson(trace.toUtf8(), &err);
    QVERIFY2(err.error == QJsonParseError::NoError, qPrintable(err.errorString()));
    QVERIFY(doc.object()["traceEvents"].toArray().size() > 6);
  }
};

QTEST_GUILESS_MAIN(EngineTest)
#include "test_engine.moc"
