// norm.wgsl's end for a plain norm: nothing after the row is written.
fn after_norm(row: u32, lid: u32) {}
