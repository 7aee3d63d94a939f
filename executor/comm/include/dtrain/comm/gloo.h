// The Gloo backend: every rank is a process (or a thread with its own device), connected to every other rank of its
// group over TCP by Gloo's tcp transport, after a rendezvous through a gloo::rendezvous::Store.
//
// The store is the caller's: in a job it is the launcher's authenticated TCP store (which implements
// gloo::rendezvous::Store); tests use gloo::rendezvous::FileStore in a fresh directory (Gloo's FileStore refuses a
// directory holding keys of an earlier run) or HashStore shared by threads. Every key this backend writes lies
// under `<store_prefix>/<name>/`: split groups under `<store_prefix>/<name>/split<N>/color<C>/`, N counting the
// splits of the parent, so groups and worlds never collide as long as each world on one store has its own prefix
// (a restarted job must use a new one).
//
// How each operation maps onto Gloo, and what it costs per rank for n ranks and N floats:
//   all_reduce      gloo::allreduce, ring algorithm (reduce-scatter then all-gather, 2(n-1)/n N floats sent).
//                   Repeatable for a fixed n and N; every rank ends bitwise equal (the all-gather phase copies each
//                   reduced segment from the rank that reduced it). The reduction order differs per segment.
//   all_gather      gloo::allgather (ring, (n-1) N floats sent for N per rank).
//   reduce_scatter  dtrain's own ring over Gloo unbound buffers: Gloo 0.5 (Debian 12) has no reduce-scatter with
//                   the option-object API. n-1 steps, each sending one block of N floats to the right neighbour
//                   and adding the block received from the left: (n-1) N floats sent, the optimum, half of an
//                   all-reduce of the same data. Block b is reduced in ring order starting at rank b+1:
//                   ((x_{b+1} op x_{b+2}) op ...) op x_b. Unlike Gloo's all-reduce it does not overlap the
//                   addition of one block with the transfer of the next.
//   broadcast       gloo::broadcast (binomial tree).
//   barrier         gloo::barrier.
//   send/recv/group Gloo unbound buffers matched by (peer, slot); the slot is the tag under a prefix byte of its
//                   own (0x40), so point-to-point traffic never meets Gloo's collectives (prefixes 0x01-0x08). A
//                   send completes when the receiver has posted its receive and the data is written.
//   split           the (color, key) of every rank through gloo::allgather on the parent, then a new Gloo context
//                   per group, connected as a full mesh through the store under the group's prefix. Groups share
//                   the world's TCP device (one listening socket and one event-loop thread per process).
//
// Timeouts: every wait for a peer (a store key during rendezvous, a message, a step of a collective) gives up after
// the timeout. A peer process that dies closes its sockets, so its neighbours fail at once ("Connection closed by
// peer" or "Connection reset by peer"); ranks that do not talk to it fail when their neighbours exit, at the latest
// after the timeout. Gloo closes every connection of a context whose operation timed out. Known Gloo 0.5 limitation:
// a send that was partly written when its connection broke is not woken (tcp::Pair::signalException wakes the
// unbound buffers waiting for a peer's notification, not those in its transmit queue), so that rank reports the
// timeout instead of the dead peer (seen in the killed-peer test, for the rank sending to the victim).
//
// After a failure: Gloo 0.5's event-loop thread may still signal (and write into) the unbound buffers of a failed
// operation after the error has reached the caller. dtrain keeps the buffers it made (the options objects of Gloo's
// collectives, its own rings and message groups) alive until the communicator is gone, and closes the connections
// before it throws, which waits out the event-loop thread; after the throw no Gloo thread touches the caller's memory.
// Buffers that Gloo's own collectives make internally (gloo::allreduce's ring, gloo::barrier) are freed by Gloo as the
// error unwinds, while the event-loop thread may still be signalling them: ThreadSanitizer reports that inside Gloo
// (tests/tsan.supp suppresses exactly those two signalling frames).
//
// SIGPIPE: Gloo writes to sockets with writev(2), which raises SIGPIPE when the peer has died; the default action
// would kill this process silently instead of reporting the dead peer. connect_gloo() therefore sets SIGPIPE to
// SIG_IGN when it is at its default (SIG_DFL) and leaves any handler the program installed alone; writes to a
// closed pipe then fail with EPIPE, as in Python and Go programs.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>

#include "dtrain/comm/communicator.h"

namespace dtrain::comm {

struct GlooOptions {
  // Address or host name this rank listens on and publishes to its peers. Loopback suits one machine; across
  // machines give the address of the interface the job should use (or `interface`).
  std::string hostname = "127.0.0.1";
  // Network interface to listen on ("eth0", "ib0"); when set it wins over `hostname`.
  std::string interface;
  std::chrono::milliseconds timeout = kDefaultTimeout;
  std::string store_prefix = "dtrain/comm";
  std::string name = "world";  // name of the world group in messages and store keys
};

// Connects rank `rank` of `size` ranks: opens a TCP device, publishes its address under the prefix and connects to
// every other rank. Every rank calls it with the same size, prefix and name. `store` must outlive the returned
// communicator and every group split from it (split() rendezvouses through it again). Throws dtrain::Error: comm
// when the rendezvous or a connection fails or times out (naming the group, the rank and the elapsed time),
// internal for rank or size out of range.
std::unique_ptr<Communicator> connect_gloo(gloo::rendezvous::Store& store, int rank, int size,
                                           const GlooOptions& options = {});

}  // namespace dtrain::comm
