// Training checkpoints: a Trainer's whole state at the end of an epoch, or at the batch where a cancel
// stopped it, so that a run that was killed or cancelled continues and ends exactly where the uninterrupted
// run would have (bit for bit, on the same devices with the same thread count).
//
// A checkpoint is a safetensors file (safetensors.h), so PyTorch's tools open it too:
//   metadata  "gpunodes.checkpoint": the format version ("1"); "gpunodes.signature": Model::signature();
//             "setting.<name>": each of Trainer::training_settings(), in order;
//             "epoch", "batch", "global_step", "optimizer_steps", "batches_tracked": integers;
//             "loss_scale": "<scale> <good steps in a row> <skipped steps>", only from a run with loss
//             scaling;
//             "seconds", "epoch_seconds": training time before, in all and in the unfinished epoch;
//             "totals": "loss_sum correct samples" of the unfinished epoch; "shares": each device's fraction
//             of a batch; "metric_series": the series' names, one per line;
//             "crc32": zlib's CRC-32 of the data region, in decimal, so that a changed byte is noticed.
//   tensors   "model/<name>" F32: every parameter and buffer, in Model::state() order;
//             "optimizer/<name>/0" and "/1" F32: each trainable parameter's optimizer state where it has
//             one (SGD's momentum buffer; Adam's exp_avg and exp_avg_sq);
//             "epochs" F64 [E, 9]: the finished epochs' EpochResults (epoch, train_loss, train_acc,
//             test_acc, seconds, images_per_second, loader_ms_per_batch, step_ms, loader_wait_ms);
//             "metrics" F64 [M, 5]: every metric sample so far (series index, epoch, step, seconds, value).
// In a directory they are named checkpoint-e<epoch>.safetensors (after epoch `epoch`) and
// checkpoint-e<epoch>-b<batch>.safetensors (a cancel after `batch` batches of epoch `epoch` + 1), with
// zero-padded numbers, and written atomically (temporary file, fsync, rename).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "gpunodes/nn/trainer.h"

namespace gn::nn {

struct TrainingCheckpoint {
  std::string signature;                                      // Model::signature()
  std::vector<std::pair<std::string, std::string>> settings;  // Trainer::training_settings()
  int64_t epoch = 0;                                          // epochs finished (trained and evaluated)
  int64_t batch = 0;  // batches of the next epoch already trained (a cancel); 0 at an epoch's end
  int64_t global_step = 0, optimizer_steps = 0, batches_tracked = 0;
  // The loss scaler's state: the scale (0 when the run had none), its good steps in a row, steps skipped.
  double loss_scale = 0;
  int64_t loss_scale_good_steps = 0, skipped_steps = 0;
  double seconds = 0, epoch_seconds = 0;
  StepTotals totals;  // of the unfinished epoch
  std::vector<double> shares;
  std::vector<EpochResult> epochs;
  std::vector<MetricSample> metrics;
  struct Values {
    std::string name;
    Shape shape;
    std::vector<float> values;
  };
  std::vector<Values> state;      // by Model::state() name
  std::vector<Values> optimizer;  // by "<parameter name>/0" and "/1"
};

// Writes atomically; throws Error when it cannot.
void write_checkpoint(const std::string& path, const TrainingCheckpoint& checkpoint);
// Reads and checks a whole checkpoint (layout, checksum, every field); throws Error saying what is wrong.
TrainingCheckpoint read_checkpoint(const std::string& path);

std::string checkpoint_file_name(int64_t epoch, int64_t batch);
struct CheckpointFile {
  std::string path;
  int64_t epoch = 0, batch = 0;
};
// The checkpoints in `dir` by their names (unread), newest first: by epoch, then batch. Other files are
// ignored; a missing directory has none.
std::vector<CheckpointFile> list_checkpoints(const std::string& dir);

// Empty when `checkpoint` may resume a run of a model with `signature` and these settings; otherwise the
// first difference, as "optimizer: the checkpoint has adam, this run sgd".
std::string checkpoint_mismatch(const TrainingCheckpoint& checkpoint, const std::string& signature,
                                const std::vector<std::pair<std::string, std::string>>& settings);

}  // namespace gn::nn
