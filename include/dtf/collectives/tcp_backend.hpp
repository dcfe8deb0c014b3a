// dtf/collectives/tcp_backend.hpp — dtf's own collective backend: the ranks of a TCP ring
// (declarations; bodies in setup.hpp and one header per algorithm). See dtf/collectives.hpp.
#pragma once

#include <dtf/collectives/options.hpp>
#include <dtf/detail/archive.hpp>
#include <dtf/detail/ring_acceptor.hpp>
#include <dtf/detail/ring_engine.hpp>
#include <dtf/detail/ring_schedule.hpp>
#include <dtf/detail/ring_socket.hpp>
#include <dtf/detail/ring_tls.hpp>
#include <dtf/transport/tls.hpp>

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <bit>
#include <cstring>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>
#include <array>

namespace dtf {

/// dtf's own backend: the ranks of a TCP ring and this process's place among them (see
/// dtf/collectives.hpp). Users normally name it through dtf::communicator.
class tcp_backend {
 public:
  /// dtf::collective_backend: buffers in host memory.
  static constexpr buffer_memory memory = buffer_memory::host;

  /// Connects rank `rank` of addresses.size() ranks: listens on `listener`, connects to
  /// addresses[rank+1] and accepts addresses[rank-1]'s connection (identities are `names`,
  /// e.g. "worker.1"; empty: "rank K"). Errors: errc::timeout naming the neighbour that did
  /// not appear within connect_timeout_ms; errc::peer_failure when a neighbour refuses (other
  /// cluster, wrong secret, TLS on one side only: the error names the cause);
  /// errc::invalid_argument for rank >= size or mismatched lists; errc::invalid_config for
  /// options.tls without a secret.
  tcp_backend(ring_listener listener, std::size_t rank, std::vector<std::string> addresses,
              std::vector<std::string> names = {}, collective_options options = {})
      : options_(std::move(options)), rank_(rank), size_(addresses.size()), addresses_(std::move(addresses)),
        names_(std::move(names)), listener_(std::move(listener)) {
    if (size_ == 0) throw error(errc::invalid_argument, "communicator: no ranks");
    if (rank_ >= size_)
      throw error(errc::invalid_argument,
                  "communicator: rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " ranks");
    if (names_.empty())
      for (std::size_t i = 0; i < size_; ++i) names_.push_back("rank " + std::to_string(i));
    if (names_.size() != size_)
      throw error(errc::invalid_argument, "communicator: " + std::to_string(names_.size()) + " names for " +
                                              std::to_string(size_) + " ranks");
    connect();
  }

  /// The backend of one process alone (size 1): every collective returns at once.
  static tcp_backend single(collective_options options = {}) {
    return tcp_backend(ring_listener{}, 0, {"local"}, {"rank 0"}, std::move(options));
  }

  tcp_backend(const tcp_backend&) = delete;
  tcp_backend& operator=(const tcp_backend&) = delete;
  /// Movable (not copyable).
  ///@{
  tcp_backend(tcp_backend&&) noexcept = default;
  tcp_backend& operator=(tcp_backend&&) noexcept = default;
  ///@}

  /// This process's rank.
  std::size_t rank() const noexcept { return rank_; }
  /// The number of ranks.
  std::size_t size() const noexcept { return size_; }
  /// The options given.
  const collective_options& options() const noexcept { return options_; }
  /// "rank 1 (worker.1 at 127.0.0.1:2223)".
  std::string describe(std::size_t r) const {
    const std::string rank_text = "rank " + std::to_string(r);
    if (names_.at(r) == rank_text) return rank_text + " (" + addresses_.at(r) + ")";
    return rank_text + " (" + names_.at(r) + " at " + addresses_.at(r) + ")";
  }

  /// In place on host bytes of dtype `type`. Errors: see the file comment.
  void allreduce_bytes(std::string_view name, dtype type, std::span<std::byte> data, reduce_op op = reduce_op::sum) {
    check_usable();
    guard([&] { do_allreduce(std::string(name), detail::fnv1a(name), type, data, op); });
  }

  /// In place: every rank's bytes become root's.
  void broadcast_bytes(std::string_view name, dtype type, std::span<std::byte> bytes, std::size_t root) {
    check_usable();
    if (root >= size_) throw error(errc::invalid_argument, "broadcast: root " + std::to_string(root));
    guard([&] { do_broadcast(std::string(name), type, bytes, root); });
  }

  /// out[k*in.size() .. (k+1)*in.size()) = rank k's in (out.size() == size() * in.size()).
  void allgather_bytes(std::string_view name, dtype type, std::span<const std::byte> in, std::span<std::byte> out) {
    check_usable();
    if (out.size() != in.size() * size_)
      throw error(errc::shape_mismatch, "allgather of '" + std::string(name) + "': output of " +
                                            std::to_string(out.size()) + " bytes for " + std::to_string(size_) +
                                            " ranks of " + std::to_string(in.size()));
    guard([&] { do_allgather(std::string(name), type, in, out); });
  }

  /// Returns once every rank has called barrier().
  void barrier() {
    check_usable();
    guard([&] { do_allreduce("<barrier>", detail::fnv1a("<barrier>"), dtype::uint8, {}, reduce_op::sum); });
  }

  /// Fused allreduce (see basic_communicator::allreduce of a list): tensors of one dtype are
  /// packed into buffers of at most fusion_threshold_bytes.
  void allreduce_fused(std::span<const named_tensor> tensors, reduce_op op) {
    check_usable();
    guard([&] { do_fused(tensors, op); });
  }

  /// Collectives completed (or started) on this communicator.
  std::uint64_t sequence() const noexcept { return sequence_; }

 private:
  void check_usable() const {
    if (failed_) throw error(errc::peer_failure, "communicator failed earlier: " + *failed_);
  }

  // Runs one collective; any failure breaks the communicator and closes its connections so
  // that the neighbours fail promptly too.
  template <class F>
  void guard(F&& f) {
    try {
      f();
    } catch (const error& e) {
      failed_ = e.message();
      close_all();
      throw;
    } catch (const std::exception& e) {
      failed_ = e.what();
      close_all();
      throw;
    }
  }

  void close_all() {
    right_.reset();
    left_.reset();
    for (auto& p : partners_) p.reset();
  }

  std::size_t right_rank() const { return (rank_ + 1) % size_; }
  std::size_t left_rank() const { return (rank_ + size_ - 1) % size_; }

  /// Power-of-two worlds of 4 or more ranks also keep a connection to each hypercube partner
  /// (rank XOR 2^k) for recursive doubling and halving.
  bool uses_hypercube() const noexcept {
    return options_.hypercube && size_ >= 4 && (size_ & (size_ - 1)) == 0;
  }
  static std::string partner_identity(const std::string& name, std::size_t d) { return name + "/xor" + std::to_string(d); }

  // Set-up and per-collective framing: dtf/collectives/setup.hpp.
  void connect();
  detail::ring_link partner_link(std::size_t k) const;
  detail::collective_descriptor descriptor(detail::collective_kind kind, const std::string& name,
                                           std::uint64_t name_hash, dtype type, std::size_t count);
  detail::ring_step header_step(const detail::collective_descriptor& mine, std::uint64_t payload);
  detail::ring_step header_step(const detail::collective_descriptor& mine, std::uint64_t payload, std::size_t from,
                                const std::string& from_name);
  void check_type(dtype type, std::size_t bytes, const std::string& name) const;

  // Allreduce: the dispatch (dtf/collectives/dispatch.hpp) and one header per algorithm.
  void do_allreduce(const std::string& name, std::uint64_t name_hash, dtype type, std::span<std::byte> data,
                    reduce_op op);
  void two_rank_allreduce(detail::collective_descriptor& d, std::span<std::byte> data, detail::reduce_fn reduce,
                          detail::scale_fn scale, const std::string& context);
  void small_allreduce(detail::collective_descriptor& d, std::span<std::byte> data, detail::reduce_fn reduce,
                       detail::scale_fn scale, const std::string& context);
  void ring_allreduce(detail::collective_descriptor& d, std::span<std::byte> data, detail::reduce_fn reduce,
                      detail::scale_fn scale, const std::string& context);
  void hypercube_allreduce(detail::collective_descriptor& d, std::span<std::byte> data, detail::reduce_fn reduce,
                           detail::scale_fn scale, const std::string& context);
  // dtf/collectives/broadcast.hpp, allgather.hpp, fusion.hpp.
  void do_broadcast(const std::string& name, dtype type, std::span<std::byte> data, std::size_t root);
  void do_allgather(const std::string& name, dtype type, std::span<const std::byte> in, std::span<std::byte> out);
  void do_fused(std::span<const named_tensor> tensors, reduce_op op);

  collective_options options_;
  std::size_t rank_ = 0, size_ = 1;
  std::vector<std::string> addresses_, names_;
  ring_listener listener_;
  detail::ring_connection right_, left_;
  std::vector<detail::ring_connection> partners_;  // hypercube partners rank ^ 2^k (power-of-two worlds)
  detail::ring_link link_;
  std::uint64_t sequence_ = 0;
  std::optional<std::string> failed_;
  std::array<std::byte, detail::collective_header_size> out_header_{}, in_header_{};
  std::vector<std::byte> staging_, slots_, fusion_;
};

}  // namespace dtf
