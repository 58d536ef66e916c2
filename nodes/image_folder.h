// The Dataset node's image_folder: a directory in torchvision's ImageFolder layout, decoded with Qt's image
// readers (PNG, JPEG and whatever else the Qt install reads) into the runtime's in-memory datasets, so that
// the runtime itself stays Qt-free.
#pragma once
#include <QSize>
#include <QString>
#include <QStringList>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "gpunodes/nn/data.h"

namespace gn::nodes {

// Where the images are: root/<class>/<file>, or root/train/<class>/<file> and root/test/<class>/<file> when
// root holds both a train and a test directory. Classes are the directory names sorted by code point, as
// Python's sorted() orders them; class i is label i.
struct ImageFolderLayout {
  QString root;
  QStringList classes;
  bool trainTestDirs = false;
  QString trainDir, testDir;  // both root without the pair
};

// Lists the class directories only (not the files): cheap enough for the checks before a run. Throws
// gn::Error naming the folder when root is not a directory, holds no class directories, a train/test pair
// differs in its class directories, or a class directory holds no files.
ImageFolderLayout scanImageFolder(const QString& root);

// The size of the first image that reads (one header), for the checks before a run; nullopt when none does.
std::optional<QSize> firstImageSize(const ImageFolderLayout& layout);

struct ImageFolderOptions {
  int channels = 1;           // 1: grey, 3: RGB (grey sources give R = G = B)
  int64_t resize = 0;         // > 0: every image scaled to resize x resize; 0: all must share one square size
  double testFraction = 0.2;  // without the train/test pair: the held-out share of each class
  uint64_t seed = 0;          // draws the held-out images and each split's order
  int64_t limit = 0;          // > 0: the first `limit` images of each split's drawn order
  bool wantTrain = true, wantTest = true;
  std::function<bool()> cancelled;       // polled on the calling thread
  std::function<void(double)> progress;  // 0..1, on the calling thread
};

struct ImageFolderData {
  ImageFolderLayout layout;
  std::shared_ptr<nn::Dataset> train, test;  // null where not wanted
  // Files that did not read as images, skipped: "path (why)", in the order of the listing.
  QStringList unreadable;
};

// Decodes the folder. Refuses, before decoding, images of different sizes without resize (naming a file and
// both sizes), non-square ones, and a set whose decoded bytes exceed the memory available now; a class left
// without a readable image is an error naming its folder. Throws CancelledError when `cancelled` says so.
ImageFolderData loadImageFolder(const QString& root, const ImageFolderOptions& options);

}  // namespace gn::nodes
