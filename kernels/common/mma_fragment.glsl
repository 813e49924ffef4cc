// Where a 16x16 f32 cooperative-matrix fragment's elements sit: the layout NVIDIA's driver gives
// (mma.sync's accumulator), which the tensor-core attention kernel relies on to keep its softmax
// in registers. Cooperative matrices leave the layout to the implementation, so the engine runs
// coopmat_fragment_probe at start-up and takes that kernel only where the device agrees.
//
// Lane L holds rows L / 4 (elements 0-3) and L / 4 + 8 (elements 4-7); a row's 16 columns spread
// over the 4 lanes of a quad, two adjacent columns per half of the row.
uint frag_group(uint e) { return e >> 2; }  // which of the lane's two rows
uint frag_row(uint lane, uint e) { return lane / 4 + 8 * frag_group(e); }
uint frag_col(uint lane, uint e) { return 8 * ((e >> 1) & 1) + 2 * (lane & 3) + (e & 1); }
