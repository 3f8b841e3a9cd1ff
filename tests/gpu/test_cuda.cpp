// CUDA backend basics: discovery and error macros tested everywhere, kernels/handles on a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dp/cuda/device.hpp"

namespace {

using dp::cuda::visible_device_count;

// Skips the current test, with the runtime's reason, on machines without a usable GPU.
#define SKIP_WITHOUT_GPU()         \
  if (visible_device_count() == 0) \
  GTEST_SKIP() << "no GPU visible: " << dp::cuda::no_device_reason()

// The message of the dp::Error that `f` throws (fails the test if it throws none).
template <typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const dp::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a dp::Error";
  return {};
}

TEST(CudaDiscovery, CountIsNonNegativeAndDoesNotThrow) {
  int count = -1;
  EXPECT_NO_THROW(count = visible_device_count());
  EXPECT_GE(count, 0);
  EXPECT_EQ(visible_device_count(), count);  // stable
}

TEST(CudaDiscovery, ReasonIsGivenExactlyWhenNoDevice) {
  const std::string reason = dp::cuda::no_device_reason();
  if (visible_device_count() == 0) {
    EXPECT_FALSE(reason.empty());
  } else {
    EXPECT_TRUE(reason.empty()) << reason;
  }
}

TEST(CudaDiscovery, SelectDeviceWithoutGpuNamesTheReason) {
  if (visible_device_count() > 0) GTEST_SKIP() << "a GPU is visible";
  const std::string msg = error_message([] { dp::cuda::select_device(0, 1, false); });
  EXPECT_NE(msg.find("no GPU is visible: " + dp::cuda::no_device_reason()), std::string::npos)
      << msg;
}

TEST(CudaDiscovery, SelectDeviceRejectsBadLocalRank) {
  const std::string msg = error_message([] { dp::cuda::select_device(2, 2, false); });
  EXPECT_NE(msg.find("local rank 2 is outside [0, 2)"), std::string::npos) << msg;
}

// The error strings are lookups in the libraries: these run without a GPU too.
TEST(CudaErrors, CudaCheckReportsCallMessageAndLocation) {
  const std::string msg = error_message([] { DP_CUDA_CHECK(cudaErrorInvalidValue); });
  EXPECT_NE(msg.find("cudaErrorInvalidValue"), std::string::npos) << msg;
  EXPECT_NE(msg.find(cudaGetErrorString(cudaErrorInvalidValue)), std::string::npos) << msg;
  EXPECT_NE(msg.find("test_cuda.cpp:"), std::string::npos) << msg;
}

TEST(CudaErrors, CudnnCheckReportsCallMessageAndLocation) {
  const std::string msg = error_message([] { DP_CUDNN_CHECK(CUDNN_STATUS_BAD_PARAM); });
  EXPECT_NE(msg.find(cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM)), std::string::npos) << msg;
  EXPECT_NE(msg.find("test_cuda.cpp:"), std::string::npos) << msg;
}

TEST(CudaDevice, SelectsLocalRankModuloCount) {
  SKIP_WITHOUT_GPU();
  const int count = visible_device_count();
  const dp::cuda::DeviceInfo info = dp::cuda::select_device(0, 1, false);
  EXPECT_EQ(info.ordinal, 0);
  EXPECT_EQ(info.visible_count, count);
  EXPECT_FALSE(info.shared);
  EXPECT_FALSE(info.name.empty());
  EXPECT_FALSE(info.pci_bus_id.empty());
  EXPECT_GT(info.total_memory, 0u);
  EXPECT_GT(info.multiprocessors, 0);
  int current = -1;
  DP_CUDA_CHECK(cudaGetDevice(&current));
  EXPECT_EQ(current, 0);

  // More ranks than GPUs: refused unless sharing is allowed, then wraps around.
  const int local_size = count + 1;
  const std::string msg = error_message([&] { dp::cuda::select_device(count, local_size, false); });
  EXPECT_NE(msg.find("GPU(s) visible"), std::string::npos) << msg;
  const dp::cuda::DeviceInfo wrapped = dp::cuda::select_device(count, local_size, true);
  EXPECT_EQ(wrapped.ordinal, 0);
  EXPECT_TRUE(wrapped.shared);
}

TEST(CudaKernels, FillAndAxpyMatchCpu) {
  SKIP_WITHOUT_GPU();
  dp::cuda::select_device(0, 1, false);
  dp::cuda::Stream stream;
  // Not a multiple of the block size, and more elements than one grid covers.
  for (size_t n : {size_t{1}, size_t{1000}, (size_t{1} << 21) + 3}) {
    std::vector<float> x(n), y(n);
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 97) - 48.0f;
    dp::cuda::DeviceBuffer<float> dx(n), dy(n);
    dx.copy_from_host(x.data());
    dp::cuda::fill(dy.data(), n, 1.5f, stream.get());
    dp::cuda::axpy(dy.data(), dx.data(), n, -0.25f, stream.get());
    stream.synchronize();
    dy.copy_to_host(y.data());
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) wrong += y[i] != 1.5f + -0.25f * x[i];  // exact in fp32
    EXPECT_EQ(wrong, 0u) << "n = " << n;
  }
  EXPECT_NO_THROW(dp::cuda::fill(nullptr, 0, 0.0f, stream.get()));  // n == 0 launches nothing
}

TEST(CudaHandles, CudnnHandleOnAStream) {
  SKIP_WITHOUT_GPU();
  dp::cuda::select_device(0, 1, false);
  dp::cuda::Stream stream;
  dp::cuda::CudnnHandle handle;
  EXPECT_NE(handle.get(), nullptr);
  EXPECT_NO_THROW(handle.set_stream(stream.get()));
  cudaStream_t bound = nullptr;
  DP_CUDNN_CHECK(cudnnGetStream(handle.get(), &bound));
  EXPECT_EQ(bound, stream.get());
  dp::cuda::CudnnHandle moved = std::move(handle);
  EXPECT_EQ(handle.get(), nullptr);
  EXPECT_NE(moved.get(), nullptr);
}

TEST(CudaHandles, StreamEventRoundTrip) {
  SKIP_WITHOUT_GPU();
  dp::cuda::select_device(0, 1, false);
  const size_t n = size_t{1} << 20;
  dp::cuda::Stream producer, consumer;
  dp::cuda::Event ready, start(true), end(true);
  dp::cuda::DeviceBuffer<float> a(n), b(n);

  start.record(producer.get());
  dp::cuda::fill(a.data(), n, 2.0f, producer.get());
  ready.record(producer.get());
  ready.wait_on(consumer.get());  // b = 0 + 3 * a, only after a is filled
  dp::cuda::fill(b.data(), n, 0.0f, consumer.get());
  dp::cuda::axpy(b.data(), a.data(), n, 3.0f, consumer.get());
  end.record(consumer.get());
  end.synchronize();
  EXPECT_TRUE(ready.query());
  EXPECT_TRUE(end.query());
  EXPECT_GE(dp::cuda::Event::elapsed_ms(start, end), 0.0f);

  std::vector<float> host(n);
  b.copy_to_host(host.data());
  size_t wrong = 0;
  for (float v : host) wrong += v != 6.0f;
  EXPECT_EQ(wrong, 0u);

  dp::cuda::DeviceBuffer<float> moved = std::move(b);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(moved.size(), n);
}

}  // namespace
