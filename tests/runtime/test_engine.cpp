// The dependency engine: hazards, overlap from the spans, the sequential schedule, errors and cancel.
#include <QtTest>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
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

bool overlap(const Span& a, const Span& b) {
  return a.start_us < b.end_us && b.start_us < a.end_us;
}

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
    rt.engine().push([](OpContext&) {}, {gate}, {x.var()}, Device::cpu(d), StreamKind::Compute,
                     {"wait gate"});
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

  // Inside an op, InlineOps runs the ops this thread pushes at once, in order, and hands them to the
  // recorder; an op for another stream is refused before it runs. The CPU's capture replays the record.
  void inline_ops_run_at_once_and_are_recorded() {
    Runtime rt;
    std::vector<int> log;
    std::vector<OpFn> recorded;
    std::string refused;
    VarPtr done = new_var();
    rt.engine().push(
        [&](OpContext& ctx) {
          InlineOps scope(ctx, [&](OpFn op) { recorded.push_back(std::move(op)); });
          for (int i = 1; i <= 3; ++i) {
            rt.engine().push([&log, i](OpContext&) { log.push_back(i); }, {}, {}, Device::cpu(),
                             StreamKind::Compute, {"inline"});
            log.push_back(10 * i);  // the op ran before push returned
          }
          try {
            rt.engine().push([&log](OpContext&) { log.push_back(-1); }, {}, {}, Device::cpu(), StreamKind::Copy,
                             {"a copy"});
          } catch (const CaptureError& e) {
            refused = e.what();
          }
        },
        {}, {done}, Device::cpu(), StreamKind::Compute, {"outer"});
    rt.engine().wait(done);
    QCOMPARE(log, (std::vector<int>{1, 10, 2, 20, 3, 30}));
    QVERIFY2(QString::fromStdString(refused).contains("'a copy' is for cpu (copy stream)"), refused.c_str());
    QCOMPARE(recorded.size(), size_t(3));
    QVERIFY(InlineOps::current() == nullptr);  // only inside the op's scope
    OpContext ctx{Device::cpu()};
    for (OpFn& op : recorded) op(ctx);
    QCOMPARE(log, (std::vector<int>{1, 10, 2, 20, 3, 30, 1, 2, 3}));
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
    rt.engine().push([](OpContext&) { throw Error("boom in op"); }, {}, {a}, Device::cpu(),
                     StreamKind::Compute, {"failing"});
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

  void cancel_a_chain_of_200000_ops() {
    // Each op writes the one variable, so each waits for the one before: after the cancel they complete one
    // from the other without running. That cascade used to recurse once per op and overflow the stack
    // (MatMul's repeat goes up to a million).
    Runtime rt;
    // The gate below waits for the host, which the backlog bound would make wait for the gate: this test is
    // about a chain longer than the default bound, so it lifts it.
    rt.engine().set_max_queued(1000000);
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

  void a_host_loop_waits_for_a_bounded_backlog() {
    Runtime rt;
    Engine& engine = rt.engine();
    QCOMPARE(engine.max_queued(), Engine::kDefaultMaxQueued);
    engine.set_max_queued(8);
    VarPtr v = new_var();
    std::vector<int> order;  // written by the ops, in turn: each writes v, so each waits for the one before
    size_t most = 0;
    for (int i = 0; i < 2000; ++i) {
      engine.push(
          [&order, i](OpContext&) {
            order.push_back(i);
            std::this_thread::sleep_for(std::chrono::microseconds(20));
          },
          {}, {v}, Device::cpu(), StreamKind::Compute, {"step"});
      most = std::max(most, engine.pending());
    }
    engine.wait_all();
    QVERIFY2(most <= 8, qPrintable(QString("%1 ops queued at once").arg(most)));
    QVERIFY(most >= 2);  // the host did run ahead, up to the bound
    QCOMPARE(int(order.size()), 2000);
    QVERIFY(std::is_sorted(order.begin(), order.end()));
    QVERIFY(std::adjacent_find(order.begin(), order.end()) == order.end());
  }

  void pushes_from_a_worker_never_wait_for_the_backlog() {
    // An op that pushes more ops (as freeing a tensor inside an op does) would wait for itself forever.
    Runtime rt;
    Engine& engine = rt.engine();
    engine.set_max_queued(1);
    std::atomic<int> ran{0};
    engine.push(
        [&](OpContext&) {
          for (int i = 0; i < 100; ++i)
            engine.push([&](OpContext&) { ++ran; }, {}, {new_var()}, Device::cpu(), StreamKind::Copy,
                        {"inner"});
        },
        {}, {new_var()}, Device::cpu(), StreamKind::Compute, {"outer"});
    auto drained = std::async(std::launch::async, [&] { engine.wait_all(); });
    const bool inTime = drained.wait_for(10s) == std::future_status::ready;
    if (!inTime) engine.cancel();  // breaks the deadlock, so that the test fails instead of hanging
    QVERIFY2(inTime, "an op pushing from its worker deadlocked");
    QCOMPARE(ran.load(), 100);
  }

  void cancel_releases_a_host_waiting_for_the_backlog() {
    Runtime rt;
    Engine& engine = rt.engine();
    engine.set_max_queued(1);
    // The running op ignores the cancel until released, so only the cancel itself can let the push go on.
    std::atomic<bool> started{false}, release{false};
    engine.push(
        [&](OpContext&) {
          started = true;
          while (!release) std::this_thread::sleep_for(1ms);
        },
        {}, {new_var()}, Device::cpu(), StreamKind::Compute, {"long"});
    while (!started) std::this_thread::sleep_for(1ms);
    std::atomic<bool> ran{false};
    auto pushing = std::async(std::launch::async, [&] {
      engine.push([&](OpContext&) { ran = true; }, {}, {new_var()}, Device::cpu(), StreamKind::Compute,
                  {"next"});
    });
    QVERIFY(pushing.wait_for(200ms) == std::future_status::timeout);  // held back by the long op
    engine.cancel();
    const bool returned = pushing.wait_for(1s) == std::future_status::ready;
    release = true;
    QVERIFY2(returned, "the waiting push did not see the cancel");
    QVERIFY_THROWS_EXCEPTION(CancelledError, engine.wait_all());
    QVERIFY(!ran);  // dropped, as every op queued after a cancel is
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

  // Whoever waits for what an op wrote, a host or a dependent op, finds the op's tag already told: the graph
  // executor relies on it to name the node that failed first.
  void a_tags_callback_runs_before_its_ops_output_is_ready() {
    Runtime rt;
    VarPtr out = new_var(), after = new_var();
    std::atomic<bool> gate{false}, told{false}, told_when_dependent_ran{false};
    {
      ScopedOpTag tag("producer");
      rt.engine().push(
          [&gate](OpContext&) {
            while (!gate.load()) std::this_thread::sleep_for(1ms);
          },
          {}, {out}, Device::cpu(), StreamKind::Compute, {"producer"});
    }
    rt.engine().when_done("producer", [&](const TagOutcome&) {
      std::this_thread::sleep_for(50ms);  // a slow callback: nobody may see the output before it ends
      told = true;
    });
    // A reader on another stream: it may start only once the producer counts as done.
    rt.engine().push([&](OpContext&) { told_when_dependent_ran = told.load(); }, {out}, {after},
                     Device::cpu(), StreamKind::Copy, {"reader"});
    gate = true;
    rt.engine().wait(out);
    QVERIFY2(told, "wait() returned before the tag's callback had run");
    rt.engine().wait_all();
    QVERIFY2(told_when_dependent_ran, "a reader ran before the tag's callback had run");
  }

  void the_profiler_keeps_the_newest_spans_by_position() {
    Profiler p(4, 3);
    for (int i = 0; i < 10; ++i) {
      p.record(Span{"op" + std::to_string(i), "n", Device::cpu(), StreamKind::Compute, double(i), i + 0.5});
      p.record(MemorySample{double(i), Device::cpu(), i, i});
    }
    QCOMPARE(p.span_count(), size_t(10));
    QCOMPARE(p.dropped_spans(), size_t(6));
    auto names = [](const std::vector<Span>& spans) {
      std::vector<std::string> out;
      for (const Span& s : spans) out.push_back(s.name);
      return out;
    };
    // A reader that fell behind gets what is kept, and its next position skips what was dropped.
    size_t next = 0;
    QCOMPARE(names(p.spans(2, &next)), (std::vector<std::string>{"op6", "op7", "op8", "op9"}));
    QCOMPARE(next, size_t(10));
    // One that keeps up loses nothing.
    QCOMPARE(names(p.spans(8, &next)), (std::vector<std::string>{"op8", "op9"}));
    QVERIFY(p.spans(next, &next).empty());
    QCOMPARE(next, size_t(10));
    p.record(Span{"op10", "n", Device::cpu(), StreamKind::Compute, 10, 10.5});
    QCOMPARE(names(p.spans(next, &next)), (std::vector<std::string>{"op10"}));
    QCOMPARE(next, size_t(11));
    const std::vector<MemorySample> kept = p.memory_samples(0, &next);
    QCOMPARE(kept.size(), size_t(3));
    QCOMPARE(kept.front().allocated, int64_t(7));
    QCOMPARE(next, size_t(10));
    // The trace holds what is kept and says how much is not.
    const QJsonObject trace =
        QJsonDocument::fromJson(QByteArray::fromStdString(p.chrome_trace_json())).object();
    int spans = 0;
    for (const QJsonValue& e : trace["traceEvents"].toArray()) spans += e.toObject()["ph"] == "X";
    QCOMPARE(spans, 4);
    QVERIFY(trace["otherData"].toObject()["dropped_spans"].toString().startsWith("7 older spans"));
  }

  void a_long_run_keeps_a_bounded_profile() {
    // A million-op host loop used to keep every span: 120 MB more per million ops.
    Runtime rt;
    VarPtr v = new_var();
    const size_t ops = Profiler::kKeptSpans + 1000;
    for (size_t i = 0; i < ops; ++i)
      rt.engine().push([](OpContext&) {}, {}, {v}, Device::cpu(), StreamKind::Compute, {"tiny"});
    rt.engine().wait_all();
    QCOMPARE(rt.profiler().span_count(), ops);
    QCOMPARE(rt.profiler().spans().size(), Profiler::kKeptSpans);
    QCOMPARE(rt.profiler().dropped_spans(), size_t(1000));
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
