// dtf/ps/device_forms.hpp — ps_client's pull and pushes over device memory (dtf::device_span,
// a device tensor's elements), a base of ps_client (dtf/ps/client.hpp): on CPU builds the
// host forms (device memory is host memory); on CUDA builds one copy through a pinned staging
// buffer per ps connection, in segments of transport_options::staging_segment_bytes, the copy
// of one segment overlapping the socket transfer of the next (dtf/ps/device_staging.hpp). A
// ps's share goes in requests of bounded size as from host memory (dtf/ps/request_parts.hpp),
// each attached to the ps's staging buffer when the previous one is answered.
// The forms taking a connection_staging run any copy engine (tests drive the schedule with
// detail::host_copy_engine).
//
// On GPUs: the CUDA engine ran on one H100 (benchmarks/gpu_bench.cpp's staging section, whose
// staged pull checks every value it brings); docs/guides/gpu.md says what else has run.
#pragma once

#include <dtf/config.hpp>
#include <dtf/detail/cuda_staging.hpp>
#include <dtf/detail/messages.hpp>
#include <dtf/device_span.hpp>
#include <dtf/ps/config.hpp>
#include <dtf/ps/device_staging.hpp>
#include <dtf/transport.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace dtf::ps_detail {

/// Client: ps_client, which gives this base its generic read / push / sync_push (an attach
/// function says where each ps's bytes come from or land).
template <class Client>
class device_forms {
 public:
#if DTF_CUDA
  /// Orders the forms' copies against stream `compute` (docs/design/gpu-execution.md, section
  /// 6.2): a push's copies wait for the work issued there first, and a pull's copies are handed to
  /// it (work issued there after the pull reads the pulled values; the host does not wait for
  /// them). Null (the default): the host waits for a pull's copies, and a push reads the device
  /// memory as it is (the caller waited for the work that wrote it).
  void set_device_stream(cudaStream_t compute) {
    stream_ = compute;
    if (staging_) staging_->set_stream(compute);
  }
#endif

  /// pull into device memory.
  std::int64_t pull(device_span<float> params) {
#if DTF_CUDA
    return pull(params, device_staging());
#else
    return self().pull(params.elements);
#endif
  }
  /// pull into device memory through the given staging (one engine per ps connection).
  template <detail::staging_copy_engine Engine>
  std::int64_t pull(device_span<float> params, detail::connection_staging<Engine>& staging) {
    auto* base = reinterpret_cast<std::byte*>(params.data());
    return self().read(
        params.size(), true,
        [&](rpc_call& c, std::size_t ps, const std::vector<std::uint32_t>& ids) {
          staging.attach_reply(c, ps, base, detail::shard_ranges(self().layout(), ids));
        },
        [&](std::size_t ps) { staging.finish_reply(ps); });
  }

  /// push_gradients from device memory (directly, or through the given staging).
  push_result push_gradients(device_span<const float> grads, std::optional<float> learning_rate = std::nullopt,
                             bool increment_step = true, bool scale_by_staleness = false) {
    return on_device(grads, [&](auto attach) {
      return self().push(grads.size(), attach, detail::gradient_kind(scale_by_staleness), learning_rate, increment_step);
    });
  }
  template <detail::staging_copy_engine Engine>
  push_result push_gradients(device_span<const float> grads, detail::connection_staging<Engine>& staging,
                             std::optional<float> learning_rate = std::nullopt, bool increment_step = true,
                             bool scale_by_staleness = false) {
    return self().push(grads.size(), staged(grads, staging), detail::gradient_kind(scale_by_staleness), learning_rate,
                       increment_step);
  }

  /// push_deltas from device memory (directly, or through the given staging).
  push_result push_deltas(device_span<const float> deltas, bool increment_step = true,
                          bool scale_by_staleness = false) {
    return on_device(deltas, [&](auto attach) {
      return self().push(deltas.size(), attach, delta_kind(scale_by_staleness), std::nullopt, increment_step);
    });
  }
  template <detail::staging_copy_engine Engine>
  push_result push_deltas(device_span<const float> deltas, detail::connection_staging<Engine>& staging,
                          bool increment_step = true, bool scale_by_staleness = false) {
    return self().push(deltas.size(), staged(deltas, staging), delta_kind(scale_by_staleness), std::nullopt,
                       increment_step);
  }

  /// push_sync from device memory (directly, or through the given staging).
  sync_result push_sync(device_span<const float> buf, std::int64_t step,
                        std::optional<float> learning_rate = std::nullopt, bool delta = false) {
    return on_device(buf, [&](auto attach) { return self().sync_push(buf.size(), attach, step, learning_rate, delta); });
  }
  template <detail::staging_copy_engine Engine>
  sync_result push_sync(device_span<const float> buf, detail::connection_staging<Engine>& staging, std::int64_t step,
                        std::optional<float> learning_rate = std::nullopt, bool delta = false) {
    return self().sync_push(buf.size(), staged(buf, staging), step, learning_rate, delta);
  }

 protected:
  ~device_forms() = default;

 private:
  Client& self() { return static_cast<Client&>(*this); }

  static detail::update_kind delta_kind(bool scale_by_staleness) {
    return scale_by_staleness ? detail::update_kind::scaled_delta : detail::update_kind::delta;
  }

  // A request's payload staged from device memory through the connection's buffer.
  template <class Engine>
  auto staged(device_span<const float> buf, detail::connection_staging<Engine>& staging) {
    return [this, buf, &staging](rpc_call& c, std::size_t ps, const std::vector<std::uint32_t>& ids) {
      staging.attach_payload(c, ps, reinterpret_cast<const std::byte*>(buf.data()),
                             detail::shard_ranges(self().layout(), ids));
    };
  }

  // f(attach) with the payload as this build moves device memory: staged (CUDA) or in place.
  template <class F>
  decltype(auto) on_device(device_span<const float> buf, F f) {
#if DTF_CUDA
    return f(staged(buf, device_staging()));
#else
    return f([this, buf](rpc_call& c, std::size_t, const std::vector<std::uint32_t>& ids) {
      self().gather(c, ids, buf.elements);
    });
#endif
  }

#if DTF_CUDA
  // One pinned buffer and stream per ps connection, made on first use.
  detail::connection_staging<detail::cuda_copy_engine>& device_staging() {
    if (!staging_) {
      staging_ = std::make_unique<detail::connection_staging<detail::cuda_copy_engine>>(
          self().layout().num_ps, self().transport().staging_segment_bytes);
      staging_->set_stream(stream_);
    }
    return *staging_;
  }
  std::unique_ptr<detail::connection_staging<detail::cuda_copy_engine>> staging_;
  cudaStream_t stream_ = nullptr;  // set_device_stream's
#endif
};

}  // namespace dtf::ps_detail
