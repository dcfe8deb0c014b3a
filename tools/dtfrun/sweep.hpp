// `dtfrun sweep`: runs a command once per combination of hyperparameter values, at most
// --parallel at a time, each run in its own output directory, and tabulates the metrics the
// runs write (see `dtfrun sweep --help`).
#pragma once

namespace dtfrun {

int sweep_main(int argc, char** argv);

}  // namespace dtfrun
