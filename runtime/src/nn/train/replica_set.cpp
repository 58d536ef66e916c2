#include "replica_set.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "gpunodes/errors.h"

namespace gn::nn::trainer_parts {

ReplicaSet::ReplicaSet(Model& model, std::vector<Device> devices)
    : model_(model), devices_(std::move(devices)) {
  for (size_t r = 0; r < devices_.size(); ++r) {
    if (r == 0 && devices_[0] == model_.device()) {
      replicas_.push_back(&model_);
    } else {
      owned_.push_back(model_.replicate(devices_[r]));
      replicas_.push_back(owned_.back().get());
    }
  }
  for (Model* m : replicas_) totals_.push_back(zeros(model_.runtime(), {2}, m->device()));
  samples_.assign(devices_.size(), 0);
  shares_.assign(devices_.size(), 1.0 / static_cast<double>(devices_.size()));
}

bool ReplicaSet::any_cuda() const {
  return std::any_of(devices_.begin(), devices_.end(), [](Device d) { return d.is_cuda(); });
}

std::vector<int64_t> ReplicaSet::split(int64_t n) const {
  // Largest remainders, so the counts sum to n and follow the shares as closely as whole samples allow.
  const size_t k = shares_.size();
  std::vector<int64_t> out(k);
  std::vector<std::pair<double, size_t>> rest;
  int64_t used = 0;
  for (size_t i = 0; i < k; ++i) {
    const double exact = shares_[i] * static_cast<double>(n);
    out[i] = static_cast<int64_t>(std::floor(exact));
    used += out[i];
    rest.emplace_back(exact - static_cast<double>(out[i]), i);
  }
  std::stable_sort(rest.begin(), rest.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (size_t j = 0; used < n; ++j, ++used) ++out[rest[j % k].second];
  return out;
}

void ReplicaSet::set_shares(std::vector<double> shares) {
  if (shares.size() != devices_.size()) throw Error("set_shares: one share per device expected");
  double sum = 0;
  for (double s : shares) {
    if (!(s >= 0)) throw Error("set_shares: shares must be non-negative");
    sum += s;
  }
  if (!(sum > 0)) throw Error("set_shares: the shares sum to zero");
  for (double& s : shares) s /= sum;
  shares_ = std::move(shares);
}

void ReplicaSet::mark_balance(const Profiler& profiler) {
  balance_span_ = profiler.span_count();
  balance_samples_ = samples_;
}

void ReplicaSet::rebalance(const Profiler& profiler) {
  // Each device's rate is the samples it processed over the time its compute stream was busy.
  std::vector<double> busy(devices_.size(), 0.0);
  for (const Span& s : profiler.spans(balance_span_)) {
    if (s.stream != StreamKind::Compute) continue;
    for (size_t r = 0; r < devices_.size(); ++r)
      if (s.device == devices_[r]) busy[r] += s.end_us - s.start_us;
  }
  std::vector<double> rate(devices_.size());
  bool measured = true;
  for (size_t r = 0; r < devices_.size() && measured; ++r) {
    const int64_t done = samples_[r] - balance_samples_[r];
    measured = done != 0 && busy[r] > 0;  // nothing measured for a device: keep the split
    if (measured) rate[r] = static_cast<double>(done) / busy[r];
  }
  if (measured) set_shares(rate);
  mark_balance(profiler);
}

int64_t ReplicaSet::samples() const {
  int64_t n = 0;
  for (int64_t s : samples_) n += s;
  return n;
}

StepTotals ReplicaSet::local_totals() const {
  StepTotals t;
  for (size_t r = 0; r < replicas_.size(); ++r) {
    auto v = to_host(totals_[r]);
    t.loss_sum += v[0];
    t.correct += v[1];
    t.samples += samples_[r];
  }
  t.padded = padded_;
  return t;
}

void ReplicaSet::reset_totals(const StepTotals& start) {
  for (size_t r = 0; r < totals_.size(); ++r)
    write_values(totals_[r], r == 0 ? std::vector<float>{static_cast<float>(start.loss_sum),
                                                         static_cast<float>(start.correct)}
                                    : std::vector<float>{0.0f, 0.0f});
  std::fill(samples_.begin(), samples_.end(), 0);
  samples_[0] = start.samples;
  padded_ = start.padded;
}

void ReplicaSet::pull_from_model() {
  if (replicas_[0] != &model_) replicas_[0]->copy_state_from(model_);
}

void ReplicaSet::copy_first_to_others() {
  for (size_t r = 1; r < replicas_.size(); ++r) replicas_[r]->copy_state_from(*replicas_[0]);
}

void ReplicaSet::share_first_buffers() {
  auto src = replicas_[0]->state();
  for (size_t r = 1; r < replicas_.size(); ++r) {
    auto dst = replicas_[r]->state();
    for (size_t i = 0; i < src.size(); ++i)
      if (!src[i]->trainable) copy_into(dst[i]->value, src[i]->value);
  }
}

void ReplicaSet::push_to_model() {
  if (replicas_[0] != &model_) model_.copy_state_from(*replicas_[0]);
  share_first_buffers();
}

void ReplicaSet::release_step_state() {
  for (Model* m : replicas_) {
    m->clear_cache();
    for (Parameter* p : m->parameters()) p->grad = Tensor();
  }
}

// --- GradientBuckets ---------------------------------------------------------------------------------------

GradientBuckets::GradientBuckets(Model& model) {
  // The first bucket is small (1 MiB) so that the first all-reduce starts early; the others are about 25 MiB,
  // few enough collectives to keep their fixed cost low.
  auto params = model.parameters();
  std::vector<size_t> bucket;
  int64_t bucket_bytes = 0;
  for (size_t i = params.size(); i-- > 0;) {
    bucket.push_back(i);
    bucket_bytes += params[i]->value.bytes();
    if (bucket_bytes >= (buckets_.empty() ? (int64_t(1) << 20) : (int64_t(25) << 20))) {
      buckets_.push_back(std::move(bucket));
      bucket.clear();
      bucket_bytes = 0;
    }
  }
  if (!bucket.empty()) buckets_.push_back(std::move(bucket));
}

int64_t GradientBuckets::allreduce(const std::vector<std::vector<Tensor>>& grads,
                                   GradientReducer& reducer) const {
  int64_t bytes = 0;
  for (const auto& bucket : buckets_) {
    std::vector<std::vector<Tensor>> part(grads.size());
    for (size_t r = 0; r < grads.size(); ++r)
      for (size_t i : bucket) part[r].push_back(grads[r][i]);
    reducer.allreduce(part);
    for (const Tensor& g : part[0]) bytes += g.bytes();
  }
  return bytes;
}

}  // namespace gn::nn::trainer_parts
