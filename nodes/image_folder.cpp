#include "image_folder.h"

#include <unistd.h>

#include <QDir>
#include <QDirIterator>
#include <QFileInfo>
#include <QImage>
#include <QImageReader>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "gpunodes/errors.h"

namespace gn::nodes {
namespace {

// Labels are bytes in the runtime's datasets.
constexpr int kMaxClasses = 256;
// Streams of shuffled_indices() for the folder's own draws, far from the epochs a loader uses.
constexpr int64_t kClassStream = int64_t(1) << 40, kTrainOrder = kClassStream - 1,
                  kTestOrder = kClassStream - 2;

std::string str(const QString& s) {
  return s.toStdString();
}

// Sorted by UTF-16 code unit: Python's sorted() order for every name without characters beyond U+FFFF, and
// independent of the locale. Hidden directories (.ipynb_checkpoints, say) are no classes.
QStringList subdirs(const QString& dir) {
  QStringList names = QDir(dir).entryList(QDir::Dirs | QDir::NoDotAndDotDot, QDir::Unsorted);
  std::sort(names.begin(), names.end());
  return names;
}

QStringList filesIn(const QString& dir) {
  QStringList names = QDir(dir).entryList(QDir::Files, QDir::Unsorted);
  std::sort(names.begin(), names.end());
  return names;
}

bool hasFile(const QString& dir) {
  return QDirIterator(dir, QDir::Files).hasNext();
}

QString joined(const QString& dir, const QString& name) {
  return QDir(dir).filePath(name);
}

QString sizeStr(const QSize& s) {
  return QString("%1x%2").arg(s.width()).arg(s.height());
}

// Why a reader failed, in words a user can act on; Qt's own message where it has one.
QString whyUnreadable(const QString& path, const QImageReader& reader) {
  if (QFileInfo(path).size() == 0) return "an empty file";
  const QString qt = reader.errorString();
  if (qt.isEmpty() || qt == "Unknown error") return "not an image Qt can read";
  return qt;
}

// MemAvailable: what the kernel can hand out now without swapping; the physical pages free as a fallback.
double availableBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    double kb = 0;
    if (fields >> kb) return kb * 1024.0;
  }
  return static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// fn(0..n-1) on up to 8 threads, the calling one among them: it alone polls for cancel and reports progress
// (from `lo` to `hi`), since the node's context belongs to it. fn must not throw.
void parallelFor(size_t n, const std::function<void(size_t)>& fn, const ImageFolderOptions& o, double lo,
                 double hi) {
  std::atomic<size_t> next{0}, done{0};
  std::atomic<bool> stop{false};
  auto work = [&] {
    for (size_t i; !stop && (i = next++) < n;) {
      fn(i);
      ++done;
    }
  };
  const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
  std::vector<std::thread> pool;
  for (size_t t = 1; t < std::min(threads, n); ++t) pool.emplace_back(work);
  int percent = -1;
  for (size_t i; !stop && (i = next++) < n;) {
    fn(i);
    ++done;
    if (o.cancelled && o.cancelled()) stop = true;
    const int now = static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(n));
    if (o.progress && now != percent) {
      percent = now;
      o.progress(lo + (hi - lo) * now / 100.0);
    }
  }
  for (std::thread& t : pool) t.join();
  if (stop) throw CancelledError();
}

struct Entry {
  QString path;
  int label = 0;
  bool testDir = false;  // listed under the pair's test directory
  QSize size;
  QString why;  // empty while it reads
};

void probe(Entry& e) {
  try {
    QImageReader reader(e.path);
    reader.setDecideFormatFromContent(true);
    if (!reader.canRead()) {
      e.why = whyUnreadable(e.path, reader);
      return;
    }
    const QSize s = reader.size();
    if (!s.isValid() || s.isEmpty()) {
      e.why = "no image size in its header";
      return;
    }
    e.size = s;
  } catch (const std::exception& ex) {
    e.why = QString::fromUtf8(ex.what());
  }
}

// One image into dst as bytes [C, side, side]; the reason when it does not decode.
QString decode(const Entry& e, int channels, int64_t resize, int64_t h, int64_t w, uint8_t* dst) {
  try {
    QImageReader reader(e.path);
    reader.setDecideFormatFromContent(true);
    QImage img = reader.read();
    if (img.isNull()) return whyUnreadable(e.path, reader);
    if (resize > 0 && img.size() != QSize(static_cast<int>(w), static_cast<int>(h)))
      img = img.scaled(static_cast<int>(w), static_cast<int>(h), Qt::IgnoreAspectRatio,
                       Qt::SmoothTransformation);
    if (img.width() != w || img.height() != h)
      return "decodes to " + sizeStr(img.size()) + ", though its header says " + sizeStr(e.size);
    const bool grey = img.format() == QImage::Format_Grayscale8;
    if (!grey) img.convertTo(QImage::Format_RGB888);
    const int64_t plane = h * w;
    for (int64_t y = 0; y < h; ++y) {
      const uchar* row = img.constScanLine(static_cast<int>(y));
      for (int64_t x = 0; x < w; ++x) {
        if (grey) {
          for (int64_t c = 0; c < channels; ++c) dst[c * plane + y * w + x] = row[x];
        } else if (channels == 1) {
          // PIL's convert("L") (ITU-R 601-2 luma), as torchvision's Grayscale: Qt's own grey conversion
          // weighs the channels in linear light and gives other values.
          const uint32_t r = row[3 * x], g = row[3 * x + 1], b = row[3 * x + 2];
          dst[y * w + x] = static_cast<uint8_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
        } else {
          // RGB888 is interleaved; the runtime's samples are planar (CHW).
          for (int64_t c = 0; c < 3; ++c) dst[c * plane + y * w + x] = row[3 * x + c];
        }
      }
    }
    return {};
  } catch (const std::exception& ex) {
    return QString::fromUtf8(ex.what());
  }
}

// Every class must keep a readable image in each directory it was listed from.
void checkClassesRead(const ImageFolderLayout& l, const std::vector<Entry>& entries) {
  for (bool testDir : {false, true}) {
    if (testDir && !l.trainTestDirs) break;
    std::vector<int> readable(static_cast<size_t>(l.classes.size()), 0), listed(readable.size(), 0);
    for (const Entry& e : entries) {
      if (e.testDir != testDir) continue;
      ++listed[e.label];
      if (e.why.isEmpty()) ++readable[e.label];
    }
    for (size_t c = 0; c < readable.size(); ++c)
      if (listed[c] > 0 && readable[c] == 0)
        throw Error("image_folder: the class folder " +
                    str(joined(testDir ? l.testDir : l.trainDir, l.classes[static_cast<int>(c)])) +
                    " has no readable image (" + std::to_string(listed[c]) + " unreadable files)");
  }
}

std::shared_ptr<nn::Dataset> makeSplit(const ImageFolderLayout& l, const char* name, size_t count,
                                       int channels, int64_t h, int64_t w) {
  auto d = std::make_shared<nn::Dataset>();
  d->name = std::string("image_folder/") + name;
  d->count = static_cast<int64_t>(count);
  d->channels = channels, d->height = h, d->width = w;
  d->classes = l.classes.size();
  for (const QString& c : l.classes) d->class_names.push_back(str(c));
  d->images.resize(count * static_cast<size_t>(d->sample_numel()));
  d->labels.resize(count);
  return d;
}

// Drops the samples that failed to decode, keeping the others in order.
void compact(nn::Dataset& d, const std::vector<char>& ok) {
  const size_t numel = static_cast<size_t>(d.sample_numel());
  size_t kept = 0;
  for (size_t i = 0; i < ok.size(); ++i) {
    if (!ok[i]) continue;
    if (kept != i) {
      std::memmove(d.images.data() + kept * numel, d.images.data() + i * numel, numel);
      d.labels[kept] = d.labels[i];
    }
    ++kept;
  }
  d.count = static_cast<int64_t>(kept);
  d.images.resize(kept * numel);
  d.labels.resize(kept);
}

}  // namespace

ImageFolderLayout scanImageFolder(const QString& root) {
  if (root.trimmed().isEmpty())
    throw Error("image_folder: set path to a directory with one sub-directory of images per class");
  const QFileInfo info(root);
  if (!info.exists()) throw Error("image_folder: the directory " + str(root) + " does not exist");
  if (!info.isDir()) throw Error("image_folder: " + str(root) + " is not a directory");
  ImageFolderLayout l;
  l.root = root;
  l.trainDir = l.testDir = root;
  const QStringList top = subdirs(root);
  if (top.contains("train") && top.contains("test")) {
    l.trainTestDirs = true;
    l.trainDir = joined(root, "train");
    l.testDir = joined(root, "test");
    l.classes = subdirs(l.trainDir);
    const QStringList testClasses = subdirs(l.testDir);
    if (l.classes.isEmpty())
      throw Error("image_folder: " + str(l.trainDir) + " has no class folders (" + str(l.trainDir) +
                  "/<class>/<image>)");
    if (l.classes != testClasses) {
      QStringList onlyTrain, onlyTest;
      for (const QString& c : l.classes)
        if (!testClasses.contains(c)) onlyTrain.append(c);
      for (const QString& c : testClasses)
        if (!l.classes.contains(c)) onlyTest.append(c);
      QStringList parts;
      if (!onlyTrain.isEmpty()) parts.append("only in train: " + onlyTrain.join(", "));
      if (!onlyTest.isEmpty()) parts.append("only in test: " + onlyTest.join(", "));
      throw Error("image_folder: " + str(l.trainDir) + " and " + str(l.testDir) +
                  " must hold the same class folders (" + str(parts.join("; ")) + ")");
    }
  } else {
    l.classes = top;
    if (l.classes.isEmpty())
      throw Error(
          "image_folder: " + str(root) +
          " has no class folders: put each class's images in a sub-directory named after the class (" +
          str(root) + "/<class>/<image>)");
  }
  if (l.classes.size() > kMaxClasses)
    throw Error("image_folder: " + str(root) + " has " + std::to_string(l.classes.size()) +
                " class folders; at most " + std::to_string(kMaxClasses) + " are supported");
  for (const QString& dir : l.trainTestDirs ? QStringList{l.trainDir, l.testDir} : QStringList{root})
    for (const QString& c : l.classes)
      if (!hasFile(joined(dir, c)))
        throw Error("image_folder: the class folder " + str(joined(dir, c)) + " is empty");
  return l;
}

std::optional<QSize> firstImageSize(const ImageFolderLayout& layout) {
  // A few files per class at most: the checks before a run must stay quick on a folder of a million files.
  constexpr int kTries = 8;
  for (const QString& c : layout.classes) {
    QDirIterator it(joined(layout.trainDir, c), QDir::Files);
    for (int i = 0; i < kTries && it.hasNext(); ++i) {
      Entry e;
      e.path = it.next();
      probe(e);
      if (e.why.isEmpty()) return e.size;
    }
  }
  return std::nullopt;
}

ImageFolderData loadImageFolder(const QString& root, const ImageFolderOptions& o) {
  if (o.channels != 1 && o.channels != 3) throw Error("image_folder: channels must be 1 (grey) or 3 (RGB)");
  if (!(o.testFraction >= 0 && o.testFraction <= 0.9))
    throw Error("image_folder: test_fraction must be between 0 and 0.9");
  ImageFolderData out;
  out.layout = scanImageFolder(root);
  const ImageFolderLayout& l = out.layout;

  // The listing: only the directories a wanted split comes from (without the pair, both come from root).
  std::vector<Entry> entries;
  for (bool testDir : {false, true}) {
    if (testDir && !l.trainTestDirs) break;
    if (l.trainTestDirs && !(testDir ? o.wantTest : o.wantTrain)) continue;
    const QString dir = testDir ? l.testDir : l.trainDir;
    for (int c = 0; c < l.classes.size(); ++c) {
      const QString classDir = joined(dir, l.classes[c]);
      for (const QString& f : filesIn(classDir)) entries.push_back({joined(classDir, f), c, testDir, {}, {}});
    }
  }

  // Headers first: sizes and memory are known before anything is decoded.
  parallelFor(
      entries.size(), [&](size_t i) { probe(entries[i]); }, o, 0.0, 0.1);
  checkClassesRead(l, entries);
  int64_t h = o.resize, w = o.resize;
  if (o.resize <= 0) {
    const Entry* first = nullptr;
    for (const Entry& e : entries) {
      if (!e.why.isEmpty()) continue;
      if (!first) {
        first = &e;
        if (e.size.width() != e.size.height())
          throw Error("image_folder: " + str(e.path) + " is " + str(sizeStr(e.size)) +
                      ", not square: set resize to scale every image to resize x resize");
      } else if (e.size != first->size) {
        throw Error("image_folder: " + str(e.path) + " is " + str(sizeStr(e.size)) + " but " +
                    str(first->path) + " is " + str(sizeStr(first->size)) +
                    ": with resize 0 all images must share one size (set resize to scale them)");
      }
    }
    if (!first) throw Error("image_folder: no file under " + str(root) + " reads as an image");
    h = first->size.height(), w = first->size.width();
  }

  // The splits as lists of entries: the pair's directories, or a held-out share of each class (stratified).
  std::vector<size_t> train, test;
  if (l.trainTestDirs) {
    for (size_t i = 0; i < entries.size(); ++i)
      if (entries[i].why.isEmpty()) (entries[i].testDir ? test : train).push_back(i);
  } else {
    for (int c = 0; c < l.classes.size(); ++c) {
      std::vector<size_t> mine;
      for (size_t i = 0; i < entries.size(); ++i)
        if (entries[i].label == c && entries[i].why.isEmpty()) mine.push_back(i);
      const int64_t n = static_cast<int64_t>(mine.size());
      // Rounded to the nearest image, keeping at least one for training.
      const int64_t held = std::min<int64_t>(std::llround(static_cast<double>(n) * o.testFraction), n - 1);
      const std::vector<int64_t> perm = nn::shuffled_indices(n, o.seed, kClassStream + c);
      for (int64_t k = 0; k < n; ++k) (k < held ? test : train).push_back(mine[perm[k]]);
    }
  }
  // Each split in an order drawn from the seed, so that `limit` takes images of every class.
  auto order = [&](std::vector<size_t>& split, int64_t stream) {
    const std::vector<int64_t> perm =
        nn::shuffled_indices(static_cast<int64_t>(split.size()), o.seed, stream);
    std::vector<size_t> shuffled(split.size());
    for (size_t k = 0; k < split.size(); ++k) shuffled[k] = split[perm[k]];
    if (o.limit > 0 && shuffled.size() > static_cast<size_t>(o.limit))
      shuffled.resize(static_cast<size_t>(o.limit));
    split = std::move(shuffled);
  };
  order(train, kTrainOrder);
  order(test, kTestOrder);
  if (!o.wantTrain) train.clear();
  if (!o.wantTest) test.clear();

  // Refused before any decoding: the bytes the splits will hold, against what the host has free now.
  const double images = static_cast<double>(train.size() + test.size());
  const double need = images * (static_cast<double>(o.channels) * static_cast<double>(h * w) + 1.0);
  const double available = availableBytes();
  if (need > available)
    throw Error("image_folder: " + std::to_string(train.size() + test.size()) + " images of " +
                std::to_string(o.channels) + "x" + std::to_string(h) + "x" + std::to_string(w) + " need " +
                format_bytes(static_cast<int64_t>(std::min(need, 9.0e18))) + " once decoded, but only " +
                format_bytes(static_cast<int64_t>(available)) +
                " of memory is available: set resize smaller, limit, or channels to 1");

  struct Job {
    size_t entry;
    nn::Dataset* data;
    size_t slot;
  };
  std::vector<Job> jobs;
  if (o.wantTrain) out.train = makeSplit(l, "train", train.size(), o.channels, h, w);
  if (o.wantTest) out.test = makeSplit(l, "test", test.size(), o.channels, h, w);
  for (size_t k = 0; k < train.size(); ++k) jobs.push_back({train[k], out.train.get(), k});
  for (size_t k = 0; k < test.size(); ++k) jobs.push_back({test[k], out.test.get(), k});
  const int64_t numel = static_cast<int64_t>(o.channels) * h * w;
  parallelFor(
      jobs.size(),
      [&](size_t j) {
        const Job& job = jobs[j];
        Entry& e = entries[job.entry];
        job.data->labels[job.slot] = static_cast<uint8_t>(e.label);
        e.why = decode(e, o.channels, o.resize, h, w, job.data->images.data() + job.slot * numel);
      },
      o, 0.1, 1.0);

  for (auto& [split, data] : {std::pair{&train, out.train.get()}, std::pair{&test, out.test.get()}}) {
    if (!data) continue;
    std::vector<char> ok(split->size());
    for (size_t k = 0; k < split->size(); ++k) ok[k] = entries[(*split)[k]].why.isEmpty();
    compact(*data, ok);
  }
  checkClassesRead(l, entries);
  for (const Entry& e : entries)
    if (!e.why.isEmpty()) out.unreadable.append(e.path + " (" + e.why + ")");
  return out;
}

}  // namespace gn::nodes
