// What the ranks of a distributed run (dist::World, MPI) must agree on beside the gradient all-reduce: that
// they train the same thing, where they start (rank 0's parameters, the same checkpoint), when they stop,
// and the numbers they report (loss, accuracy and speed summed or gathered over the ranks). Without a world
// (a process alone) every member does nothing and returns what it was given.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gpunodes/dist/world.h"
#include "gpunodes/nn/model.h"
#include "gpunodes/nn/trainer.h"

namespace gn::nn::trainer_parts {

class RankAgreement {
 public:
  // world: null, or an MPI world. `give_up` says whether a collective should stop waiting now (a cancel).
  RankAgreement(dist::World* world, std::function<bool()> give_up);

  dist::World* world() const { return world_; }
  bool distributed() const { return world_ != nullptr; }

  // Throws Error naming the first line where another rank's `description` (one "name: value" per line: the
  // model, the local devices, the training settings) differs from rank 0's.
  void check_same_run(const std::string& description) const;
  // Throws Error unless every rank resumes from a checkpoint of this file name.
  void check_same_checkpoint(const std::string& file_name) const;
  // Rank 0's parameters, buffers and count of training forwards into `model` on every other rank.
  void broadcast_root_state(Model& model) const;
  // Whether any rank was asked to stop (one 8-byte all-reduce), so that all stop at the same batch;
  // `engine_cancelled` alone interrupts the wait.
  bool agree_to_stop(bool asked, const std::function<bool()>& engine_cancelled) const;
  // Totals summed over the ranks; and an evaluation's sums (loss, hits or errors, counts), element-wise.
  StepTotals sum(StepTotals local) const;
  std::vector<double> sum_values(std::vector<double> local) const;

  // Counts the gradient bytes this rank handed to the all-reduce in one step.
  void count_step(int64_t reduced_bytes) {
    reduced_bytes_ += reduced_bytes;
    ++steps_;
  }
  // Every rank's speed (rank order): this one's is `images_per_second`, `allreduce_ms` (its all-reduce
  // spans) and `parameter_bytes`, with the counted bytes per step.
  std::vector<RankStats> gather_stats(double images_per_second, double allreduce_ms,
                                      double parameter_bytes) const;

 private:
  dist::World* world_;
  std::function<bool()> give_up_;
  int64_t reduced_bytes_ = 0, steps_ = 0;
};

}  // namespace gn::nn::trainer_parts
