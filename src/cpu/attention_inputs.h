// attention_inputs.h — the checks every CPU attention entry point makes on its batch and page
// lists before reading the cache. Internal to src/cpu.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cisa/core/batch.h"
#include "cisa/core/status.h"
#include "cisa/cpu/kv_cache.h"
#include "cisa/cpu/selection.h"

namespace cisa::cpu {

// validate_batch's checks, then: num_q_heads a positive multiple of the cache's KV heads; page
// lists built for those KV heads, with consistent offsets; every query group inside its batch
// entry at the right packed row, every packed row in exactly one group, and every listed page
// owned by the group's sequence. row_offsets ([entries + 1]: first packed row of each entry)
// and row_group ([rows]: packed row → query group) are filled as a by-product; callers pass
// reused storage so a decode step allocates nothing.
Status validate_attention_inputs(const PagedKvCache& cache, int layer,
                                 std::span<const BatchEntry> batch, const PageLists& lists,
                                 int num_q_heads, std::vector<int64_t>* row_offsets,
                                 std::vector<int64_t>* row_group);

}  // namespace cisa::cpu
