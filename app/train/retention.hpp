// Checkpoint retention: which epochs --save-every writes, and which files --keep-last deletes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dp/checkpoint.hpp"

namespace dp::app {

// True when model_epoch_<epochs_done>.h5 is written: every `save_every` epochs and after the
// last epoch (`total_epochs`). model_best.h5 is written whenever an epoch is the best, and a
// preempted run writes its resume point whatever this says.
bool epoch_checkpoint_due(int64_t epochs_done, int save_every, int64_t total_epochs);

// The epoch checkpoints (step 0) of `files` (newest first, as list_checkpoints gives them) beyond
// the newest `keep_last`; 0 keeps everything. The newest checkpoint is never among them, and
// model_best.h5 is never listed by list_checkpoints, so it is never deleted. Mid-epoch files are
// left to the trainer (removed once an epoch checkpoint after them exists).
std::vector<std::string> checkpoints_beyond(const std::vector<CheckpointFile>& files,
                                            int keep_last);

}  // namespace dp::app
