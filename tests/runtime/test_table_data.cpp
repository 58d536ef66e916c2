// CSV tables as value datasets (nn/sequence_data.h's load_table): the task each table is found to be, features
// standardised with the training split's statistics, and the test split stratified by class.
#include <QtTest>
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "gpunodes/errors.h"
#include "gpunodes/nn/sequence_data.h"
#include "nn_test_util.h"

using namespace gn;
using namespace gn::nn;

class TableDataTest : public QObject {
  Q_OBJECT

 private slots:
  void a_table_finds_its_task() {
    Files files;
    TableOptions o;
    o.test_fraction = 0;
    o.path = files.write("r.csv", "a,b,y\n1,2,3.5\n2,2,-1\n3,2,7\n").toStdString();
    o.target = "y";
    TableData t = load_table(o);
    QVERIFY(t.train->regression);
    QCOMPARE(t.train->classes, int64_t(1));
    QCOMPARE(t.train->targets, (std::vector<float>{3.5f, -1, 7}));  // raw, not standardised
    QCOMPARE(t.train->feature_names, (std::vector<std::string>{"a", "b"}));
    QCOMPARE(t.train->sample_shape, Shape{2});

    // RFC 4180: quoted fields with commas, doubled quotes and line ends; CRLF records.
    o.path = files
                 .write("c.csv",
                        "x,\"the, species\"\r\n1,setosa\r\n2,\"vir\"\"gin\nica\"\r\n3,setosa\r\n"
                        "4,versicolor\r\n")
                 .toStdString();
    o.target = "the, species";
    t = load_table(o);
    QVERIFY(!t.train->regression);
    QCOMPARE(t.train->class_names, (std::vector<std::string>{"setosa", "versicolor", "vir\"gin\nica"}));
    QCOMPARE(t.train->classes, int64_t(3));
    QCOMPARE(t.train->targets, (std::vector<float>{0, 2, 0, 1}));
    o.task = TableOptions::Task::Regression;
    expect_error([&] { load_table(o); }, {"line 2", "'the, species'", "number 2", "'setosa'", "regression"});

    // Numbers as classes sort by value.
    o.path = files.write("n.csv", "x,y\n1,10\n2,2\n3,1\n4,2\n").toStdString();
    o.target = "y";
    o.task = TableOptions::Task::Classification;
    t = load_table(o);
    QCOMPARE(t.train->class_names, (std::vector<std::string>{"1", "2", "10"}));
    QCOMPARE(t.train->targets, (std::vector<float>{2, 1, 0, 1}));
    o.features = {"y"};
    expect_error([&] { load_table(o); }, {"target", "cannot also be a feature"});
  }

  void features_are_standardised_with_the_training_statistics() {
    Files files;
    TableOptions o;
    o.path = files.write("s.csv", "a,b,c,y\n1,7,0,u\n2,7,10,v\n3,7,0,u\n4,7,10,v\n").toStdString();
    o.target = "y";
    o.features = {"c", "a", "b"};
    o.test_fraction = 0;
    const DatasetPtr d = load_table(o).train;
    QCOMPARE(d->feature_names, (std::vector<std::string>{"c", "a", "b"}));
    // By hand: c has mean 5 and std 5; a mean 2.5 and std sqrt(1.25); b is constant (std 1).
    QCOMPARE(d->feature_mean, (std::vector<double>{5, 2.5, 7}));
    QCOMPARE(d->feature_std[0], 5.0);
    QCOMPARE(d->feature_std[1], std::sqrt(1.25));
    QCOMPARE(d->feature_std[2], 1.0);
    const float s = static_cast<float>(1 / std::sqrt(1.25));
    const std::vector<float> want{-1, -1.5f * s, 0, 1, -0.5f * s, 0, -1, 0.5f * s, 0, 1, 1.5f * s, 0};
    for (size_t k = 0; k < want.size(); ++k) QVERIFY(std::abs(d->values[k] - want[k]) < 1e-6f);

    // With a split, the test rows are standardised with the training rows' statistics. Row r has a = r and
    // b = r * r, and its target r tells which row a sample is.
    QByteArray csv = "a,b,y\n";
    for (int r = 0; r < 20; ++r)
      csv += QByteArray::number(r) + "," + QByteArray::number(r * r) + "," + QByteArray::number(r) + "\n";
    TableOptions so;
    so.path = files.write("split.csv", csv).toStdString();
    so.target = "y";
    so.test_fraction = 0.25;
    so.seed = 9;
    const TableData t = load_table(so);
    QCOMPARE(t.test->count, int64_t(5));
    QCOMPARE(t.train->count, int64_t(15));
    double sa = 0, sb = 0, qa = 0, qb = 0;
    for (float r : t.train->targets) sa += r, sb += r * r;
    const double ma = sa / 15, mb = sb / 15;
    for (float r : t.train->targets) qa += (r - ma) * (r - ma), qb += (r * r - mb) * (r * r - mb);
    const double da = std::sqrt(qa / 15), db = std::sqrt(qb / 15);
    QVERIFY(std::abs(t.test->feature_mean[0] - ma) < 1e-9 && std::abs(t.test->feature_mean[1] - mb) < 1e-9);
    QVERIFY(std::abs(t.test->feature_std[0] - da) < 1e-9 && std::abs(t.test->feature_std[1] - db) < 1e-9);
    for (const DatasetPtr& split : {t.train, t.test})
      for (int64_t i = 0; i < split->count; ++i) {
        const double r = split->targets[i];
        QVERIFY(std::abs(split->values[i * 2] - (r - ma) / da) < 1e-5);
        QVERIFY(std::abs(split->values[i * 2 + 1] - (r * r - mb) / db) < 1e-5);
        if (i > 0) QVERIFY(split->targets[i] > split->targets[i - 1]);  // the file's order
      }
  }

  void the_test_split_is_stratified_by_class() {
    Files files;
    QByteArray csv = "id,label\n";
    const std::map<QByteArray, int> sizes{{"A", 10}, {"B", 7}, {"C", 3}, {"D", 2}};
    int id = 0;
    for (int round = 0; round < 10; ++round)  // interleaved, so that the file's order is no split
      for (const auto& [label, n] : sizes)
        if (round < n) csv += QByteArray::number(id++) + "," + label + "\n";
    TableOptions o;
    o.path = files.write("strata.csv", csv).toStdString();
    o.target = "label";
    o.test_fraction = 0.3;
    std::set<std::vector<float>> picks;
    for (uint64_t seed : {1, 2, 3}) {
      o.seed = seed;
      const TableData t = load_table(o);
      QVERIFY(!t.train->regression);
      QCOMPARE(t.train->class_names, (std::vector<std::string>{"A", "B", "C", "D"}));
      for (int c = 0; c < 4; ++c) {
        const auto inTest = std::count(t.test->targets.begin(), t.test->targets.end(), float(c));
        const auto inTrain = std::count(t.train->targets.begin(), t.train->targets.end(), float(c));
        const int n = sizes.at(QByteArray(1, char('A' + c)));
        QCOMPARE(static_cast<int>(inTest + inTrain), n);
        QVERIFY2(inTest >= 1 && inTrain >= 1, qPrintable(QString("class %1").arg(c)));
        QVERIFY2(std::abs(inTest - 0.3 * n) <= 1.0,
                 qPrintable(QString("class %1: %2 of %3").arg(c).arg(inTest).arg(n)));
      }
      // The test rows' ids, recovered from their standardised feature.
      std::vector<float> ids;
      for (int64_t i = 0; i < t.test->count; ++i)
        ids.push_back(std::round(t.test->values[i] * t.test->feature_std[0] + t.test->feature_mean[0]));
      picks.insert(ids);
      QCOMPARE(load_table(o).test->values, t.test->values);  // the seed decides
    }
    QVERIFY2(picks.size() > 1, "every seed held out the same rows");
  }

};

QTEST_GUILESS_MAIN(TableDataTest)
#include "test_table_data.moc"
