#include "rank_agreement.h"

#include <cstdio>
#include <cstring>
#include <sstream>
#include <utility>

#include "gpunodes/errors.h"
#include "gpunodes/nn/layers.h"

namespace gn::nn::trainer_parts {

RankAgreement::RankAgreement(dist::World* world, std::function<bool()> give_up)
    : world_(world), give_up_(std::move(give_up)) {}

void RankAgreement::check_same_run(const std::string& description) const {
  if (!world_) return;
  const std::vector<std::string> all =
      world_->allgather(description, "comparing the ranks' training", give_up_);
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    std::istringstream a(all[0]), b(all[r]);
    std::string la, lb;
    while (std::getline(a, la) && std::getline(b, lb) && la == lb) {
    }
    throw Error("rank " + std::to_string(r) + " does not train what rank 0 trains: rank 0 has '" + la +
                "', rank " + std::to_string(r) + " '" + lb + "'");
  }
}

void RankAgreement::check_same_checkpoint(const std::string& file_name) const {
  if (!world_) return;
  const auto all = world_->allgather(file_name, "comparing the checkpoints the ranks resume from");
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0])
      throw Error("resume: rank " + std::to_string(r) + " found checkpoint '" + all[r] + "' but rank 0 '" +
                  all[0] + "': every rank must see the same checkpoint_dir");
}

void RankAgreement::broadcast_root_state(Model& m) const {
  // Every rank starts from rank 0's parameters and buffers (and its count of training forwards), whatever
  // seed or file each one built its model from.
  if (!world_) return;
  const auto state = m.state();
  std::vector<char> bytes;
  if (world_->is_root()) {
    const int64_t tracked = m.batches_tracked();
    bytes.insert(bytes.end(), reinterpret_cast<const char*>(&tracked),
                 reinterpret_cast<const char*>(&tracked) + 8);
    for (const Parameter* p : state) {
      const std::vector<float> v = to_host(p->value);
      bytes.insert(bytes.end(), reinterpret_cast<const char*>(v.data()),
                   reinterpret_cast<const char*>(v.data() + v.size()));
    }
  }
  world_->broadcast(bytes, 0, "broadcasting rank 0's parameters", give_up_);
  size_t expected = 8;
  for (const Parameter* p : state) expected += static_cast<size_t>(p->value.numel()) * sizeof(float);
  if (bytes.size() != expected)
    throw dist::CommError("rank 0's parameters arrived as " + std::to_string(bytes.size()) + " bytes, not " +
                          std::to_string(expected));
  if (world_->is_root()) return;
  int64_t tracked = 0;
  std::memcpy(&tracked, bytes.data(), 8);
  m.set_batches_tracked(tracked);
  size_t at = 8;
  for (Parameter* p : state) {
    std::vector<float> v(static_cast<size_t>(p->value.numel()));
    std::memcpy(v.data(), bytes.data() + at, v.size() * sizeof(float));
    at += v.size() * sizeof(float);
    write_values(p->value, std::move(v));
  }
}

bool RankAgreement::agree_to_stop(bool asked, const std::function<bool()>& engine_cancelled) const {
  if (!world_) return asked;
  double votes = asked ? 1.0 : 0.0;
  world_->allreduce_sum(&votes, 1, "agreeing whether to stop", dist::World::Channel::Host, engine_cancelled);
  return votes > 0;
}

StepTotals RankAgreement::sum(StepTotals t) const {
  if (!world_) return t;
  // Every rank calls this at the same batches, so the sums over the ranks are everyone's numbers.
  double sums[4] = {t.loss_sum, t.correct, static_cast<double>(t.samples), static_cast<double>(t.padded)};
  world_->allreduce_sum(sums, 4, "summing the loss over the ranks", dist::World::Channel::Host, give_up_);
  StepTotals all = t;
  all.loss_sum = sums[0];
  all.correct = sums[1];
  all.samples = static_cast<int64_t>(sums[2]);
  all.padded = static_cast<int64_t>(sums[3]);
  return all;
}

std::vector<double> RankAgreement::sum_values(std::vector<double> local) const {
  if (world_ && !local.empty())
    world_->allreduce_sum(local.data(), local.size(), "summing the evaluation over the ranks",
                          dist::World::Channel::Host, give_up_);
  return local;
}

std::vector<RankStats> RankAgreement::gather_stats(double images_per_second, double allreduce_ms,
                                                   double parameter_bytes) const {
  if (!world_) return {};
  const double per_step = steps_ ? static_cast<double>(reduced_bytes_) / static_cast<double>(steps_) : 0.0;
  char mine[128];
  std::snprintf(mine, sizeof mine, "%.17g %.17g %.17g %.17g", images_per_second, allreduce_ms, per_step,
                parameter_bytes);
  const auto all = world_->allgather(mine, "gathering the ranks' speeds");
  std::vector<RankStats> out;
  for (size_t r = 0; r < all.size(); ++r) {
    RankStats st;
    st.rank = static_cast<int>(r);
    std::istringstream(all[r]) >> st.images_per_second >> st.allreduce_ms >> st.allreduce_bytes_per_step >>
        st.parameter_bytes;
    out.push_back(st);
  }
  return out;
}

}  // namespace gn::nn::trainer_parts
