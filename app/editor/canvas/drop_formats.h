// What the canvas takes dropped (a palette entry dragged): a node type's name, or a library block's file.
// Include: nothing; the palette and the view both include it, so the palette need not know the view.
#pragma once

namespace gn::editor {

inline constexpr char kNodeTypeMime[] = "application/x-gpunodes-node-type";
inline constexpr char kBlockMime[] = "application/x-gpunodes-block";

}  // namespace gn::editor
