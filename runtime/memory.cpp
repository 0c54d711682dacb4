#include "runtime/memory.h"

#include "runtime/error.h"

namespace wm {

MemoryPlan& MemoryPlan::drop(std::string id) {
  MemoryOp op;
  op.kind = MemoryOp::Kind::Drop;
  op.id = std::move(id);
  ops.push_back(std::move(op));
  return *this;
}

MemoryPlan& MemoryPlan::bank(std::string id, std::function<Block(const Block&)> transform) {
  MemoryOp op;
  op.kind = MemoryOp::Kind::Bank;
  op.id = std::move(id);
  op.transform = std::move(transform);
  ops.push_back(std::move(op));
  return *this;
}

MemoryPlan& MemoryPlan::fetch(std::string id, std::string region, std::optional<Reanchor> reanchor) {
  MemoryOp op;
  op.kind = MemoryOp::Kind::Fetch;
  op.id = std::move(id);
  op.region = std::move(region);
  op.reanchor = reanchor;
  ops.push_back(std::move(op));
  return *this;
}

MemoryPlan& MemoryPlan::insert(std::string region, Block block) {
  MemoryOp op;
  op.kind = MemoryOp::Kind::Insert;
  op.id = block.id;
  op.region = std::move(region);
  op.block = std::move(block);
  ops.push_back(std::move(op));
  return *this;
}

MemoryPlan& MemoryPlan::keep_per_head(int layer, std::vector<std::vector<int64_t>> head_tokens) {
  keep(layer, {});
  ops.back().head_tokens = std::move(head_tokens);
  return *this;
}

MemoryPlan& MemoryPlan::keep(int layer, std::vector<int64_t> tokens) {
  MemoryOp op;
  op.kind = MemoryOp::Kind::Keep;
  op.id = str_cat("layer ", layer);
  op.layer = layer;
  op.tokens = std::move(tokens);
  ops.push_back(std::move(op));
  return *this;
}

MemoryPlan& MemoryPlan::shift(int layer, int64_t begin, int64_t count, Reanchor reanchor) {
  MemoryOp op;
  op.kind = MemoryOp::Kind::Shift;
  op.id = str_cat("layer ", layer);
  op.layer = layer;
  op.begin = begin;
  op.count = count;
  op.reanchor = reanchor;
  ops.push_back(std::move(op));
  return *this;
}

MemoryPlan& MemoryPlan::write_head(int layer, int head, std::vector<int64_t> tokens, at::Tensor k, at::Tensor v,
                                   at::Tensor logw) {
  write(layer, std::move(tokens), std::move(k), std::move(v), std::move(logw));
  ops.back().head = head;
  return *this;
}

MemoryPlan& MemoryPlan::write(int layer, std::vector<int64_t> tokens, at::Tensor k, at::Tensor v, at::Tensor logw,
                              at::Tensor pos) {
  MemoryOp op;
  op.kind = MemoryOp::Kind::Write;
  op.id = str_cat("layer ", layer);
  op.layer = layer;
  op.tokens = std::move(tokens);
  op.k = std::move(k);
  op.v = std::move(v);
  op.logw = std::move(logw);
  op.pos = std::move(pos);
  ops.push_back(std::move(op));
  return *this;
}

MemoryPlan& MemoryPlan::store(Block block, Tier tier) {
  MemoryOp op;
  op.kind = MemoryOp::Kind::Store;
  op.id = block.id;
  op.block = std::move(block);
  op.tier = tier;
  ops.push_back(std::move(op));
  return *this;
}

MemoryPlan& MemoryPlan::move(std::string id, Reanchor reanchor) {
  MemoryOp op;
  op.kind = MemoryOp::Kind::Move;
  op.id = std::move(id);
  op.reanchor = reanchor;
  ops.push_back(std::move(op));
  return *this;
}

MemoryPlan& MemoryPlan::tag(std::string id, BlockMeta meta, std::string region) {
  MemoryOp op;
  op.kind = MemoryOp::Kind::Tag;
  op.id = std::move(id);
  op.region = std::move(region);
  op.block.meta = std::move(meta);
  ops.push_back(std::move(op));
  return *this;
}

KvMemory::KvMemory(KvSpec spec, std::vector<std::string> regions, StoreConfig bank) {
  bank.device = spec.device;
  window_ = std::make_unique<KvWindow>(std::move(spec), std::move(regions));
  bank_ = std::make_unique<BlockStore>(std::move(bank));
}

namespace {
const char* op_name(MemoryOp::Kind k) {
  switch (k) {
    case MemoryOp::Kind::Drop: return "drop";
    case MemoryOp::Kind::Bank: return "bank";
    case MemoryOp::Kind::Fetch: return "fetch";
    case MemoryOp::Kind::Insert: return "insert";
    case MemoryOp::Kind::Keep: return "keep";
    case MemoryOp::Kind::Shift: return "shift";
    case MemoryOp::Kind::Write: return "write";
    case MemoryOp::Kind::Move: return "move";
    case MemoryOp::Kind::Store: return "store";
    case MemoryOp::Kind::Tag: return "tag";
  }
  return "?";
}
}  // namespace

void KvMemory::clear() {
  window_->clear();
  for (const auto& id : bank_->ids()) bank_->erase(id);
}

void KvMemory::apply(MemoryPlan plan) {
  for (auto& op : plan.ops) {
    try {
      switch (op.kind) {
        case MemoryOp::Kind::Drop:
          window_->drop(op.id);
          break;
        case MemoryOp::Kind::Bank: {
          Block b = window_->remove(op.id);
          bank_->put(op.transform ? op.transform(b) : std::move(b), Tier::Device);
          break;
        }
        case MemoryOp::Kind::Fetch: {
          Block b;
          try {
            b = bank_->get(op.id);
          } catch (const LostData& e) {
            ++lost_fetches_;
            last_lost_ = e.what();
            break;
          }
          window_->place(op.region, std::move(b), op.reanchor);
          break;
        }
        case MemoryOp::Kind::Insert:
          window_->place(op.region, op.block);
          break;
        case MemoryOp::Kind::Keep:
          if (op.head_tokens.empty()) window_->keep_tokens(op.layer, op.tokens);
          else window_->keep_tokens_per_head(op.layer, op.head_tokens);
          break;
        case MemoryOp::Kind::Shift:
          window_->shift_tokens(op.layer, op.begin, op.count, op.reanchor.value_or(Reanchor{}));
          break;
        case MemoryOp::Kind::Write:
          if (op.head >= 0) window_->write_head_tokens(op.layer, op.head, op.tokens, op.k, op.v, op.logw);
          else window_->write_tokens(op.layer, op.tokens, op.k, op.v, op.logw, op.pos);
          break;
        case MemoryOp::Kind::Store:
          bank_->put(std::move(op.block), op.tier);
          break;
        case MemoryOp::Kind::Tag:
          window_->set_meta(op.id, std::move(op.block.meta), op.region);
          break;
        case MemoryOp::Kind::Move: {
          WM_CHECK(window_->layout().find(op.id).first >= 0, "no segment '", op.id, "' in the window");
          const Reanchor re = op.reanchor.value_or(Reanchor{});
          for (int l = 0; l < window_->spec().n_layers; ++l)
            window_->shift_tokens(l, window_->layout().segment_begin(l, op.id), window_->layout().segment_len(l, op.id), re);
          break;
        }
      }
    } catch (const CorruptData& e) {
      throw CorruptData(str_cat("memory: ", op_name(op.kind), " '", op.id, "': ", e.what()));
    } catch (const Error& e) {
      throw Error(str_cat("memory: ", op_name(op.kind), " '", op.id, "': ", e.what()));
    }
  }
}

}  // namespace wm
