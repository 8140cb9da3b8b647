// The MPI side of ring attention: a private duplicate of the user's communicator, byte messages of
// any size, and the collective agreement on errors that keeps every rank from waiting on one that
// failed.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace attn::distributed {

// A duplicate of the caller's communicator for the duration of one call, so that the ring's
// messages can never match the caller's own. MPI_Comm_dup and MPI_Comm_free are collective: every
// rank constructs and destroys one in the same order.
class PrivateComm {
 public:
  explicit PrivateComm(MPI_Comm comm);
  ~PrivateComm();
  PrivateComm(const PrivateComm&) = delete;
  PrivateComm& operator=(const PrivateComm&) = delete;

  MPI_Comm get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int right() const { return (rank_ + 1) % size_; }
  int left() const { return (rank_ + size_ - 1) % size_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

// Throws attn::Error("<fn>: <what>") when `comm` is not a usable intra-communicator or MPI is not
// initialised. Local (no communication): every rank decides the same for the same communicator.
void check_communicator(const char* fn, MPI_Comm comm);

// Collective: every rank passes its own error ("" = none, else "<fn>: <what>"); every rank gets ""
// when none failed, else "<fn>: rank r of P: <what>" of the lowest failing rank. One MPI_Allgather
// of a fixed-size record.
std::string agree_on_error(MPI_Comm comm, const char* fn, const std::string& local_error);

// Non-blocking sends / receives of n bytes, split into pieces that fit MPI's int counts; the
// requests are appended to `requests`. n == 0 posts nothing (both sides know the size, so neither
// waits).
void isend_bytes(const void* data, size_t n, int dest, int tag, MPI_Comm comm,
                 std::vector<MPI_Request>* requests);
void irecv_bytes(void* data, size_t n, int source, int tag, MPI_Comm comm,
                 std::vector<MPI_Request>* requests);

// Lets MPI progress outstanding transfers (rendezvous protocols move data only inside MPI calls).
void poke(std::vector<MPI_Request>* requests);
void wait_all(std::vector<MPI_Request>* requests);

// Broadcasts n bytes from `root`, in pieces that fit MPI's int counts.
void bcast_bytes(void* data, size_t n, int root, MPI_Comm comm);

}  // namespace attn::distributed
