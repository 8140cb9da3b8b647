#include "distributed/ring_comm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "attn/error.h"

namespace attn::distributed {

namespace {
// Largest piece of one message: well below INT_MAX bytes.
constexpr size_t kPiece = size_t{1} << 30;
// One rank's entry in the error agreement: a flag and the start of its message.
struct ErrorRecord {
  int32_t failed = 0;
  char message[500] = {};
};
}  // namespace

PrivateComm::PrivateComm(MPI_Comm comm) {
  MPI_Comm_dup(comm, &comm_);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

PrivateComm::~PrivateComm() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void check_communicator(const char* fn, MPI_Comm comm) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    throw Error(fmt::format("{}: MPI is not initialised (call MPI_Init first)", fn));
  if (comm == MPI_COMM_NULL) throw Error(fmt::format("{}: comm is MPI_COMM_NULL", fn));
  int inter = 0;
  MPI_Comm_test_inter(comm, &inter);
  if (inter) throw Error(fmt::format("{}: comm must be an intra-communicator", fn));
}

std::string agree_on_error(MPI_Comm comm, const char* fn, const std::string& local_error) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  ErrorRecord mine;
  if (!local_error.empty()) {
    mine.failed = 1;
    const size_t n = std::min(local_error.size(), sizeof(mine.message) - 1);
    std::memcpy(mine.message, local_error.data(), n);
  }
  std::vector<ErrorRecord> all(size);
  MPI_Allgather(&mine, sizeof(ErrorRecord), MPI_BYTE, all.data(), sizeof(ErrorRecord), MPI_BYTE,
                comm);
  for (int r = 0; r < size; ++r) {
    if (all[r].failed) {
      all[r].message[sizeof(all[r].message) - 1] = '\0';
      std::string what = all[r].message;
      const std::string prefix = std::string(fn) + ": ";
      if (what.rfind(prefix, 0) == 0) what.erase(0, prefix.size());
      return fmt::format("{}: rank {} of {}: {}", fn, r, size, what);
    }
  }
  return {};
}

void isend_bytes(const void* data, size_t n, int dest, int tag, MPI_Comm comm,
                 std::vector<MPI_Request>* requests) {
  const char* p = static_cast<const char*>(data);
  for (size_t done = 0; done < n; done += kPiece) {
    const int count = static_cast<int>(std::min(kPiece, n - done));
    MPI_Request r;
    MPI_Isend(p + done, count, MPI_BYTE, dest, tag, comm, &r);
    requests->push_back(r);
  }
}

void irecv_bytes(void* data, size_t n, int source, int tag, MPI_Comm comm,
                 std::vector<MPI_Request>* requests) {
  char* p = static_cast<char*>(data);
  for (size_t done = 0; done < n; done += kPiece) {
    const int count = static_cast<int>(std::min(kPiece, n - done));
    MPI_Request r;
    MPI_Irecv(p + done, count, MPI_BYTE, source, tag, comm, &r);
    requests->push_back(r);
  }
}

void poke(std::vector<MPI_Request>* requests) {
  if (requests->empty()) return;
  int flag = 0;
  MPI_Testall(static_cast<int>(requests->size()), requests->data(), &flag, MPI_STATUSES_IGNORE);
}

void wait_all(std::vector<MPI_Request>* requests) {
  if (!requests->empty()) {
    MPI_Waitall(static_cast<int>(requests->size()), requests->data(), MPI_STATUSES_IGNORE);
  }
  requests->clear();
}

void bcast_bytes(void* data, size_t n, int root, MPI_Comm comm) {
  char* p = static_cast<char*>(data);
  for (size_t done = 0; done < n; done += kPiece) {
    const int count = static_cast<int>(std::min(kPiece, n - done));
    MPI_Bcast(p + done, count, MPI_BYTE, root, comm);
  }
}

}  // namespace attn::distributed
