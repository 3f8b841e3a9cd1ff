// --save-every and --keep-last: the pure decisions, applied by the trainer on rank 0.
#include "train/retention.hpp"

namespace dp::app {

bool epoch_checkpoint_due(int64_t epochs_done, int save_every, int64_t total_epochs) {
  return save_every <= 1 || epochs_done % save_every == 0 || epochs_done >= total_epochs;
}

std::vector<std::string> checkpoints_beyond(const std::vector<CheckpointFile>& files,
                                            int keep_last) {
  std::vector<std::string> doomed;
  if (keep_last <= 0) return doomed;
  int kept = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    if (files[i].step != 0) continue;
    // The newest file of all (files[0]) is always kept, whatever its kind.
    if (i == 0 || kept < keep_last) {
      ++kept;
      continue;
    }
    doomed.push_back(files[i].path);
  }
  return doomed;
}

}  // namespace dp::app
