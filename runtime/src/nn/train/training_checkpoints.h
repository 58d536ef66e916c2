// The trainer's checkpoints (checkpoint.h has the file format): the settings a run is known by, where its
// checkpoints go and how many stay, the newest one a run may continue from, and the model's and
// optimizer's part of the state, saved from and restored into models.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpunodes/nn/checkpoint.h"
#include "gpunodes/nn/model.h"
#include "gpunodes/nn/optim.h"
#include "gpunodes/nn/trainer.h"

namespace gn::nn::trainer_parts {

// Trainer::training_settings(): what a checkpoint must have been written with to resume a run of `options`
// on `train`, as (name, value) pairs named as the Train node's params.
std::vector<std::pair<std::string, std::string>> training_settings(const TrainOptions& options,
                                                                   const Dataset& train);

class CheckpointStore {
 public:
  explicit CheckpointStore(CheckpointOptions options);
  // Whether the run keeps checkpoints at all (a directory is set).
  bool enabled() const { return !options_.dir.empty(); }
  bool resume() const { return enabled() && options_.resume; }
  // Creates the directory and probes that it can be written; Error saying why not. Before any training:
  // finding out at the end of the first epoch would cost the epoch.
  void prepare() const;
  // Whether a checkpoint is due after `done` of a run's `epochs` epochs.
  bool due_after_epoch(int64_t done, int64_t epochs) const;
  // Writes `c` as its (epoch, batch) file in the directory, then removes the oldest beyond `keep` (never the
  // one just written); returns the path.
  std::string write(const TrainingCheckpoint& c) const;

  struct Found {
    TrainingCheckpoint checkpoint;
    std::string path;
  };
  // The newest checkpoint in the directory that reads back whole and, when it is of `model`'s signature,
  // holds its state and optimizer state tensor by tensor (others are skipped with a warning). Throws Error
  // when it is of another run (signature or `settings`) or past this run's `epochs` of `batches_per_epoch`;
  // nullopt when there is none.
  std::optional<Found> find_resumable(const Model& model,
                                      const std::vector<std::pair<std::string, std::string>>& settings,
                                      int64_t epochs, int64_t batches_per_epoch,
                                      const WarningCallback& on_warning) const;

 private:
  CheckpointOptions options_;
};

// The model's state (parameters, buffers, training forwards) and the optimizer state kept beside its
// parameters, into `c` (blocking reads).
void save_model_state(Model& model, const std::vector<OptimizerState>& optimizer_state,
                      TrainingCheckpoint& c);
// A checkpoint that find_resumable() returned: its state into `model` (enqueued writes).
void restore_model_state(const TrainingCheckpoint& c, Model& model);
// Its optimizer state for `replica`'s parameters, made on the replica's device: one entry per parameter,
// empty where the checkpoint holds none.
std::vector<OptimizerState> restore_optimizer_state(const TrainingCheckpoint& c, Model& replica);

}  // namespace gn::nn::trainer_parts
