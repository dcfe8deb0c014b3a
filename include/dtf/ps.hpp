// dtf/ps.hpp — the parameter server and its client (the public umbrella of dtf/ps/).
//
// A ps task holds shards of the model's variables (placed by a partitioner, dtf/partitioners.hpp)
// in host memory. The layers:
//   dtf/ps/config.hpp           ps_config (rule, apply mode, replicas to aggregate), ps_options
//   dtf/detail/messages.hpp     the wire messages (update_kind; std::optional learning rate)
//   dtf/ps/shard_store.hpp      the shards and the one apply(shard, update)
//   dtf/ps/sync_aggregator.hpp  synchronous steps (SyncReplicasOptimizer semantics)
//   dtf/ps/server.hpp           parameter_server: dispatch and the checks against a hostile peer
//   dtf/ps/client.hpp           ps_client: pull, push, push_sync; init, ready, shutdown
//   dtf/ps/done_client.hpp      ps_client's end of a job: mark_done, workers_done, the chief's wait
//   dtf/ps/checkpointing.hpp    save_checkpoint / restore_checkpoint / restore_latest
//   dtf/ps/embedding_layout.hpp sparse variables: fixed (div/mod) and hashed tables, row routing
//   dtf/ps/sparse_store.hpp     the ps's table shards and their lazy per-row updates
//   dtf/ps/sparse_service.hpp   the ps's sparse requests (create, gather, push, stats, restore), its
//                               table file at a save, and their checks
//   dtf/ps/sparse_client.hpp    embedding_tables: plan, gather, push (only the touched rows)
//   dtf/ps/table_checkpoint.hpp the tables in checkpoints: restore_tables (re-routes rows to the ps)
#pragma once

#include <dtf/ps/checkpointing.hpp>
#include <dtf/ps/client.hpp>
#include <dtf/ps/config.hpp>
#include <dtf/ps/server.hpp>
#include <dtf/ps/sparse_client.hpp>
#include <dtf/ps/table_checkpoint.hpp>
