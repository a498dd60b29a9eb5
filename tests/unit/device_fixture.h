#ifndef GPUEXEC_TESTS_UNIT_DEVICE_FIXTURE_H_
#define GPUEXEC_TESTS_UNIT_DEVICE_FIXTURE_H_

// The fixture of the device layer's tests (device_test.cc,
// device_graphs_test.cc): a Device on the libcuda test double with one
// stream, and waits for its completions.
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/device/device.h"

namespace gpuexec::device {
namespace {

// Runs an asynchronous Device operation and waits (with a deadline) for its
// completion.
template <typename T>
absl::StatusOr<T> Await(const std::function<void(Callback<T>)>& op) {
  auto done = std::make_shared<absl::Notification>();
  auto result = std::make_shared<absl::StatusOr<T>>(absl::UnknownError("no completion"));
  op([done, result](absl::StatusOr<T> r) {
    *result = std::move(r);
    done->Notify();
  });
  if (!done->WaitForNotificationWithTimeout(absl::Seconds(20))) {
    return absl::DeadlineExceededError("the completion never came");
  }
  return *result;
}

absl::Status AwaitDone(const std::function<void(Done)>& op) {
  return Await<bool>([&](Callback<bool> cb) {
           op([cb](absl::Status st) {
             if (st.ok())
               cb(true);
             else
               cb(st);
           });
         })
      .status();
}

class DeviceFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // A short launch queue in the double, as a full one in the driver: an
    // enqueue past it blocks the caller (here, the device's executor).
    setenv("GXFAKE_STREAM_QUEUE", "6", 1);
    auto d = cuda::Driver::Load(GXFAKE_LIBRARY_PATH);
    ASSERT_TRUE(d.ok()) << d.status();
    driver_ = d->release();
  }

  void SetUp() override {
    DeviceOptions options;
    options.staging_bytes = 4096;
    options.staging_slots = 2;
    options.max_queued_launches = MaxQueuedLaunches();
    options.max_held_per_stream = MaxHeld();
    Configure(options);
    auto dev = Device::Open(driver_, 0, options);
    ASSERT_TRUE(dev.ok()) << dev.status();
    device_ = std::move(dev).value();
    stream_ = 7;
    absl::Status created =
        AwaitDone([&](Done d) { device_->CreateStream(stream_, absl::ZeroDuration(), {}, d); });
    ASSERT_TRUE(created.ok()) << created;
  }

  void TearDown() override {
    if (device_ != nullptr) {
      EXPECT_TRUE(AwaitDone([&](Done d) { device_->DestroyStream(stream_, d); }).ok());
    }
  }

  virtual int MaxQueuedLaunches() const { return 0; }
  virtual size_t MaxHeld() const { return 8192; }
  // Anything else of the device's options.
  virtual void Configure(DeviceOptions&) {}

  // A launch of gx_spin for `ms` (a kernel of `image`, given id 1 on
  // `device`, the fixture's by default).
  LaunchOp Spin(const std::shared_ptr<const ModuleImage>& image, uint64_t ms,
                Device* device = nullptr) {
    if (device == nullptr) device = device_.get();
    auto k = Await<KernelInfo>(
        [&](Callback<KernelInfo> cb) { device->GetKernel(image, "gx_spin", 1, "module m", cb); });
    EXPECT_TRUE(k.ok()) << k.status();
    LaunchOp op;
    op.kernel = 1;
    op.param_block.assign(8, '\0');
    const uint64_t ns = ms * 1000000;
    std::memcpy(op.param_block.data(), &ns, 8);
    op.what = "kernel 'gx_spin'";
    return op;
  }

  std::shared_ptr<const ModuleImage> Image(const std::string& text) {
    auto image = std::make_shared<ModuleImage>();
    image->sha256 = std::string(64, 'a' + static_cast<char>(text.size() % 6));
    image->bytes = text;
    return image;
  }

  static inline const cuda::Driver* driver_ = nullptr;
  std::unique_ptr<Device> device_;
  StreamId stream_ = 0;
};

}  // namespace
}  // namespace gpuexec::device

#endif  // GPUEXEC_TESTS_UNIT_DEVICE_FIXTURE_H_
