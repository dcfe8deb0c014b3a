// dtf/checkpoint.hpp — sharded checkpoints on disk (DESIGN.md §7).
//
// A checkpoint named NAME (by default "ckpt-<global step>") in directory DIR is:
//   DIR/NAME.ps-I-of-N.shard   one file per ps task I: the shards it held (values, then the
//                              update rule's slots: momentum, Adagrad accumulators, Adam's m
//                              and v), with each shard's update count (Adam's t)
//   DIR/NAME.tables-I-of-N     one file per ps task I that held embedding tables: their rows
//                              (dtf/checkpoint/table_file.hpp; restored by restore_tables,
//                              dtf/ps/table_checkpoint.hpp)
//   DIR/NAME.manifest.json     written by the chief after every shard file: the variables
//                              (name, shape, dtype, place in the flat buffer), the shard layout
//                              (which rows of which variable each ps held), the global step,
//                              the update rule, and every shard file's size and SHA-256
//   DIR/checkpoint             the state file: {"latest": NAME, "all": [kept names, oldest first]}
//
// Shard file format (little-endian):
//   0   8  magic "DTFSHRD1"
//   8   8  header length H
//   16  H  header (JSON): {"format":1,"ps":I,"num_ps":N,"global_step":S,"num_slots":K,
//                          "entries":[{"shard":id,"size":elements,"iterations":t}, ...]}
//          (a ps writes it last, padded with spaces to H: dtf/ps/shard_snapshot.hpp; a file
//          written while a synchronous job's steps were held adds "synchronous":true). S is the
//          manifest's step in ps 0's file and every synchronous one, at most it in the others
//          (an asynchronous job's other ps keep the step of its last init or restore)
//   ... raw float32: for each entry in order, its values then its K slots (size floats each)
// Tensor bytes are written raw, never through a serialisation archive; JSON holds only the
// metadata.
//
// Crash safety: every file is written under a fresh temporary name (FINAL.tmp.<random>,
// created with O_CREAT|O_EXCL|O_NOFOLLOW: never through a planted symlink), flushed to disk
// (fsync), renamed over its final name, and the directory is synced. A checkpoint exists for
// a reader only once the state file names it, which happens after its manifest is in place,
// which happens after every shard file is; so a crash at any point of a save leaves the
// previous checkpoint as the latest, intact.
//
// A checkpoint directory is input (it may be damaged, truncated or crafted): one reader,
// checkpoint_reader (dtf/checkpoint/reader.hpp), used by restore, dtf-ckpt and every free
// function here, checks every number and name before use (dtf/checkpoint/format.hpp: no
// wrap-around, shapes whose element count overflows refused, totals against the files' sizes,
// dtype and rule from a closed set, names confined to the directory) and every file's size and
// SHA-256 against the manifest before it hands out a byte; it reads ranges straight from the
// files, so restore streams. When the latest checkpoint fails verification, restore says so
// and uses the newest kept one that verifies (checkpoint_fallback; or refuses).
//
// Resharding: checkpoint_reader::read() serves any range of the saved flat layout from however
// many shard files were written; ps_client's restore reads each of its own shards' ranges, so
// a checkpoint saved by 2 ps tasks restores into 1 or 3.
//
// Headers: checkpoint/format.hpp (the types and the checks of every field),
// checkpoint/shard_header.hpp (a shard file's header), checkpoint/fields.hpp (typed, checked
// JSON fields), checkpoint/table_format.hpp and checkpoint/table_file.hpp (embedding tables), checkpoint/input_file.hpp (bounds-checked
// reads), checkpoint/reader.hpp (reading, verifying, the fallback), checkpoint/writer.hpp
// (the files' contents, commit and pruning), checkpoint/atomic_file.hpp (crash-safe writing).
//
// Thread safety: free functions on distinct checkpoints may run concurrently; saving into one
// directory is the chief's job (one writer of the manifest and state file).
// Errors: dtf::error with errc::io_error (a file cannot be opened, written, renamed),
// errc::corrupt_data (a checksum, size, magic, header, field or layout does not match, naming
// the file and the field),
// errc::invalid_argument / shape_mismatch (a variable missing or of another shape).
#pragma once

#include <dtf/checkpoint/format.hpp>
#include <dtf/checkpoint/reader.hpp>
#include <dtf/checkpoint/writer.hpp>
