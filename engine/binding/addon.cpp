// The node-addon-api binding. One engine thread per loaded model owns the model and its backend (for
// CUDA: the device context); the JS thread only queues jobs and receives results through a
// thread-safe function, so it never waits on compute. engine/index.ts is the only caller and validates
// parameters before they arrive here; this file still rejects malformed values with a TypeError.
#include <napi.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "backend.h"
#include "batch.h"
#include "decode.h"
#include "decode_params.h"
#include "model.h"

namespace {

using Delivery = std::function<void(Napi::Env)>;

void call_delivery(Napi::Env env, Napi::Function, std::nullptr_t*, Delivery* delivery) {
  // env is null when the function is being torn down (process exit): drop the delivery.
  std::unique_ptr<Delivery> owned(delivery);
  if (env == nullptr) return;
  // Nothing may escape into Node's event loop as a C++ exception (that aborts the process).
  try {
    (*owned)(env);
  } catch (const Napi::Error& e) {
    e.ThrowAsJavaScriptException();
  } catch (const std::exception& e) {
    Napi::Error::New(env, e.what()).ThrowAsJavaScriptException();
  }
}

// A way back to the JS thread for one job: every post runs on the JS thread in order. The thread-safe
// function keeps the event loop alive until `finish` releases it, as a pending native job should.
using Channel = Napi::TypedThreadSafeFunction<std::nullptr_t, Delivery, call_delivery>;

Channel open_channel(Napi::Env env, const char* name) {
  return Channel::New(env, name, 0, 1);
}

void post(const Channel& channel, Delivery delivery) {
  auto* item = new Delivery(std::move(delivery));
  // The queue is unbounded, so this fails only while the environment shuts down.
  if (channel.NonBlockingCall(item) != napi_ok) delete item;
}

// The engine's own thread: runs the queued jobs in order, and while `work` reports more to do (generations
// being decoded), one step of it between them, so that a job queued meanwhile waits for one step at most.
class EngineThread {
 public:
  explicit EngineThread(std::function<bool()> work) : work_(std::move(work)), thread_([this] { loop(); }) {}
  ~EngineThread() { stop(); }

  void enqueue(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    wake_.notify_one();
  }

  // Finishes the queued jobs and the work, then joins.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    bool busy = false;  // the last call of work_ had more to do
    for (;;) {
      std::deque<std::function<void()>> jobs;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || !jobs_.empty() || busy; });
        if (jobs_.empty() && !busy) return;
        jobs.swap(jobs_);
      }
      for (auto& job : jobs) job();
      busy = work_();
    }
  }

  std::function<bool()> work_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the members above exist
};

std::vector<int32_t> int32_array(const Napi::Value& value, const char* what) {
  if (!value.IsTypedArray() || value.As<Napi::TypedArray>().TypedArrayType() != napi_int32_array) {
    throw Napi::TypeError::New(value.Env(), std::string(what) + " must be an Int32Array");
  }
  auto array = value.As<Napi::Int32Array>();
  return std::vector<int32_t>(array.Data(), array.Data() + array.ElementLength());
}

Napi::Value get_field(const Napi::Object& object, const char* key) {
  Napi::Value value = object.Get(key);
  if (value.IsUndefined()) {
    throw Napi::TypeError::New(object.Env(), std::string("decode params: '") + key + "' is missing");
  }
  return value;
}

double number_field(const Napi::Object& object, const char* key) {
  Napi::Value value = get_field(object, key);
  if (!value.IsNumber()) {
    throw Napi::TypeError::New(object.Env(), std::string("decode params: '") + key + "' must be a number");
  }
  return value.As<Napi::Number>().DoubleValue();
}

std::string string_field(const Napi::Object& object, const char* key) {
  Napi::Value value = get_field(object, key);
  if (!value.IsString()) {
    throw Napi::TypeError::New(object.Env(), std::string("decode params: '") + key + "' must be a string");
  }
  return value.As<Napi::String>().Utf8Value();
}

a2d::DecodeParams read_params(const Napi::Object& o) {
  Napi::Env env = o.Env();
  a2d::DecodeParams p;
  p.max_tokens = static_cast<int64_t>(number_field(o, "maxTokens"));
  p.block_size = static_cast<int>(number_field(o, "blockSize"));
  p.threshold = number_field(o, "threshold");
  p.min_per_step = static_cast<int>(number_field(o, "minPerStep"));
  p.steps = static_cast<int>(number_field(o, "steps"));
  p.temperature = number_field(o, "temperature");
  p.top_p = number_field(o, "topP");
  const std::string remasking = string_field(o, "remasking");
  const std::string advance = string_field(o, "advance");
  const std::string commit = string_field(o, "commit");
  const std::string reveal_order = string_field(o, "revealOrder");
  if (!a2d::parse_remasking(remasking, &p.remasking)) {
    throw Napi::TypeError::New(env, "decode params: remasking must be " + a2d::choice_problem(a2d::decoding_spec("remasking"), remasking));
  }
  if (!a2d::parse_advance(advance, &p.advance)) {
    throw Napi::TypeError::New(env, "decode params: advance must be " + a2d::choice_problem(a2d::decoding_spec("advance"), advance));
  }
  if (!a2d::parse_commit(commit, &p.commit)) {
    throw Napi::TypeError::New(env, "decode params: commit must be " + a2d::choice_problem(a2d::decoding_spec("commit"), commit));
  }
  if (!a2d::parse_reveal_order(reveal_order, &p.reveal_order)) {
    throw Napi::TypeError::New(env, "decode params: revealOrder must be " +
                                        a2d::choice_problem(a2d::decoding_spec("reveal_order"), reveal_order));
  }
  Napi::Value seed = get_field(o, "seed");
  bool lossless = false;
  if (!seed.IsBigInt()) throw Napi::TypeError::New(env, "decode params: seed must be a bigint");
  p.seed = seed.As<Napi::BigInt>().Uint64Value(&lossless);
  if (!lossless) throw Napi::RangeError::New(env, "decode params: seed must be in 0..2^64-1");
  Napi::Value eos = get_field(o, "eosTokenIds");
  if (!eos.IsArray()) throw Napi::TypeError::New(env, "decode params: eosTokenIds must be an array");
  auto eos_array = eos.As<Napi::Array>();
  for (uint32_t i = 0; i < eos_array.Length(); ++i) {
    Napi::Value id = eos_array.Get(i);
    if (!id.IsNumber()) throw Napi::TypeError::New(env, "decode params: eosTokenIds must hold numbers");
    p.eos_token_ids.push_back(id.As<Napi::Number>().Int32Value());
  }
  p.trace = get_field(o, "trace").ToBoolean();
  return p;
}

// [[j, token, confidence], ...]
Napi::Array revealed_array(Napi::Env env, const std::vector<a2d::Revealed>& values) {
  Napi::Array array = Napi::Array::New(env, values.size());
  for (size_t k = 0; k < values.size(); ++k) {
    Napi::Array entry = Napi::Array::New(env, 3);
    entry.Set(0u, values[k].j);
    entry.Set(1u, values[k].token);
    entry.Set(2u, values[k].confidence);
    array.Set(k, entry);
  }
  return array;
}

Napi::Array int_array(Napi::Env env, const std::vector<int32_t>& values) {
  Napi::Array array = Napi::Array::New(env, values.size());
  for (size_t i = 0; i < values.size(); ++i) array.Set(i, Napi::Number::New(env, values[i]));
  return array;
}

Napi::Object result_object(Napi::Env env, const a2d::GenerateResult& r) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("tokenIds", int_array(env, r.tokens));
  o.Set("finishReason", a2d::finish_reason_name(r.finish_reason));
  o.Set("promptTokens", static_cast<double>(r.prompt_tokens));
  o.Set("completionTokens", static_cast<double>(r.tokens.size()));
  o.Set("forwardPasses", static_cast<double>(r.forward_passes));
  o.Set("prefillForwards", static_cast<double>(r.prefill_forwards));
  o.Set("steps", static_cast<double>(r.steps));
  o.Set("revealed", static_cast<double>(r.revealed));
  o.Set("toppedUp", static_cast<double>(r.topped_up));
  o.Set("tokensPerForward",
        r.forward_passes == 0 ? 0.0 : static_cast<double>(r.tokens.size()) / static_cast<double>(r.forward_passes));
  o.Set("ms", r.ms);
  Napi::Array trace = Napi::Array::New(env, r.trace.size());
  for (size_t i = 0; i < r.trace.size(); ++i) {
    const a2d::TraceStep& s = r.trace[i];
    Napi::Object step = Napi::Object::New(env);
    step.Set("forward", static_cast<double>(s.forward));
    step.Set("blockStart", static_cast<double>(s.block_start));
    step.Set("step", s.step);
    step.Set("candidates", int_array(env, s.candidates));
    step.Set("revealed", revealed_array(env, s.revealed));
    trace.Set(i, step);
  }
  o.Set("trace", trace);
  return o;
}

Napi::Object info_object(Napi::Env env, const a2d::Model& model, const a2d::Backend& backend,
                         const std::string& device) {
  const a2d::ModelConfig& c = model.config;
  const a2d::DecodeParams& d = c.decoding;
  Napi::Object decoding = Napi::Object::New(env);
  decoding.Set("blockSize", d.block_size);
  decoding.Set("threshold", d.threshold);
  decoding.Set("minPerStep", d.min_per_step);
  decoding.Set("steps", d.steps);
  decoding.Set("temperature", d.temperature);
  decoding.Set("topP", d.top_p);
  decoding.Set("remasking", a2d::remasking_name(d.remasking));
  decoding.Set("advance", a2d::advance_name(d.advance));
  decoding.Set("commit", a2d::commit_name(d.commit));
  decoding.Set("revealOrder", a2d::reveal_order_name(d.reveal_order));
  Napi::Object info = Napi::Object::New(env);
  info.Set("architecture", c.architecture);
  info.Set("modelType", c.model_type);
  info.Set("numLayers", c.num_layers);
  info.Set("hiddenSize", c.hidden_size);
  info.Set("numHeads", c.num_heads);
  info.Set("numKvHeads", c.num_kv_heads);
  info.Set("headDim", c.head_dim);
  info.Set("vocabSize", c.vocab_size);
  info.Set("numParameters", static_cast<double>(model.num_parameters));
  info.Set("maskTokenId", c.mask_token_id);
  info.Set("shiftLogits", c.shift_logits);
  info.Set("eosTokenIds", int_array(env, d.eos_token_ids));
  info.Set("maxContext", static_cast<double>(backend.max_context()));
  info.Set("device", device);
  info.Set("trained", c.trained);
  info.Set("precision", a2d::precision_name(c.precision));
  info.Set("decoding", decoding);
  return info;
}

class NativeEngine : public Napi::ObjectWrap<NativeEngine> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "NativeEngine",
                       {InstanceMethod("generate", &NativeEngine::Generate),
                        InstanceMethod("cancel", &NativeEngine::Cancel),
                        InstanceMethod("forwardLogits", &NativeEngine::ForwardLogits),
                        InstanceMethod("totalForwardPasses", &NativeEngine::TotalForwardPasses),
                        InstanceMethod("close", &NativeEngine::Close)});
  }

  explicit NativeEngine(const Napi::CallbackInfo& info) : Napi::ObjectWrap<NativeEngine>(info) {}

  ~NativeEngine() override {
    cancel_all();
    // Without close(): the model and backend die on the thread that owns them, once the cancelled
    // generations have left.
    thread_.enqueue([this] {
      queue_.push_back(Queued{nullptr, [this] { release_model(); }});
    });
    thread_.stop();
  }

  // Loads on the engine thread; resolves with this object once the model is ready.
  Napi::Promise StartLoad(Napi::Env env, std::string dir, std::string device, int threads, int64_t max_context,
                          int32_t max_batch) {
    return run_async<bool>(
        env, "a2d.load",
        [this, dir, device, threads, max_context, max_batch](const Channel&) {
          try {
            model_ = a2d::load_model(dir);
            a2d::BackendOptions options;
            options.threads = threads;
            options.max_context = max_context;
            options.max_batch = max_batch;
            if (device == "cpu") {
              backend_ = a2d::make_cpu_backend(*model_, options);
            } else {
#ifdef A2D_CUDA
              backend_ = a2d::make_cuda_backend(*model_, options);
#else
              throw std::runtime_error("device 'cuda' needs the CUDA addon (a2d_cuda.node, built by "
                                       "`npm run build:cuda`); this addon has the CPU backend only");
#endif
            }
            batch_ = std::make_unique<a2d::BatchDecoder>(*backend_, max_batch);
          } catch (...) {
            release_model();
            throw;
          }
          return true;
        },
        [this, device](Napi::Env env, bool&) -> Napi::Value {
          Napi::Object info = info_object(env, *model_, *backend_, device);
          info.Set("maxBatch", batch_->capacity());
          Value().Set("info", info);
          return Value();
        });
  }

 private:
  struct GenerateJob {
    std::vector<int32_t> prompt;
    a2d::DecodeParams params;
    Napi::FunctionReference on_block;
    std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);
    std::string callback_error;  // an exception thrown by onBlock; JS thread only
  };

  // A generation on the engine thread: its sequence, and how its promise is settled on the JS thread.
  struct Generation {
    std::shared_ptr<GenerateJob> job;  // its plain fields only: the JS references stay on the JS thread
    std::unique_ptr<a2d::Sequence> sequence;
    std::function<void(a2d::GenerateResult, std::string error)> settle;
  };

  // An entry of the engine thread's queue, in the order the calls came: a generation joins the batch once a
  // slot is free; any other job (load, forwardLogits, close) waits until no generation runs, then runs alone.
  struct Queued {
    std::unique_ptr<Generation> generation;
    std::function<void()> job;
  };

  void ensure_open(Napi::Env env) const {
    if (closed_) throw Napi::Error::New(env, "the engine is closed");
  }

  void release_model() {
    batch_.reset();
    backend_.reset();
    model_.reset();
  }

  // The engine thread between jobs: admits queued generations into free slots, runs a queued job once the
  // batch is empty, and steps the batch once. True while there is more to do.
  bool work() {
    while (!queue_.empty()) {
      Queued& front = queue_.front();
      if (front.generation == nullptr) {
        if (batch_ != nullptr && batch_->running() > 0) break;
        auto job = std::move(front.job);
        queue_.pop_front();
        job();
        continue;
      }
      if (batch_ != nullptr && batch_->full()) break;
      std::unique_ptr<Generation> generation = std::move(front.generation);
      queue_.pop_front();
      if (batch_ == nullptr) {
        generation->settle({}, "the engine is closed");
        continue;
      }
      const uint64_t id = next_id_++;
      batch_->add(id, std::move(generation->sequence), generation->job->cancel.get());
      running_[id] = std::move(generation);
    }
    if (batch_ == nullptr || batch_->running() == 0) return !queue_.empty();
    const int64_t before = batch_->sequence_forwards();
    std::vector<a2d::BatchDecoder::Finished> finished = batch_->step();
    total_forwards_.fetch_add(batch_->sequence_forwards() - before);
    for (a2d::BatchDecoder::Finished& f : finished) {
      auto it = running_.find(f.id);
      it->second->settle(std::move(f.result), std::move(f.error));
      running_.erase(it);
    }
    return true;
  }

  // The one shape of every asynchronous call but generate: `work` runs on the engine thread, alone (with the
  // call's channel, for posts of its own before it ends); then, on the JS thread, `cleanup` (if any) runs
  // whatever happened and `settle` gives the value the promise resolves with. An exception from `work` (a
  // std::exception) or from `settle` (a Napi::Error) rejects the promise instead. The object stays referenced
  // until it settles.
  template <typename Result>
  Napi::Promise run_async(Napi::Env env, const char* name, std::function<Result(const Channel&)> work,
                          std::function<Napi::Value(Napi::Env, Result&)> settle, std::function<void()> cleanup = {}) {
    auto deferred = std::make_shared<Napi::Promise::Deferred>(env);
    Channel channel = open_channel(env, name);
    Ref();
    auto job = [this, deferred, channel, work = std::move(work), settle = std::move(settle), cleanup = std::move(cleanup)] {
      auto result = std::make_shared<Result>();
      std::string error;
      try {
        *result = work(channel);
      } catch (const std::exception& e) {
        error = e.what();
      }
      post(channel, [this, deferred, error, result, settle, cleanup](Napi::Env env) {
        if (cleanup) cleanup();
        try {
          if (!error.empty()) throw Napi::Error::New(env, error);
          deferred->Resolve(settle(env, *result));
        } catch (const Napi::Error& e) {
          deferred->Reject(e.Value());
        }
        Unref();
      });
      channel.Release();
    };
    thread_.enqueue([this, job = std::move(job)] { queue_.push_back(Queued{nullptr, job}); });
    return deferred->Promise();
  }

  // Queues a generation: it joins the batch at the next forward with a free slot, and its promise settles once
  // it finishes (blocks stream through onBlock meanwhile).
  Napi::Value Generate(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    ensure_open(env);
    if (info.Length() < 4 || !info[1].IsObject() || !info[3].IsNumber()) {
      throw Napi::TypeError::New(env, "generate(promptIds: Int32Array, params: object, onBlock?, token: number)");
    }
    auto job = std::make_shared<GenerateJob>();
    job->prompt = int32_array(info[0], "promptIds");
    job->params = read_params(info[1].As<Napi::Object>());
    if (info[2].IsFunction()) job->on_block = Napi::Persistent(info[2].As<Napi::Function>());
    const double token = info[3].As<Napi::Number>().DoubleValue();
    {
      std::lock_guard<std::mutex> lock(cancel_mutex_);
      cancel_flags_[token] = job->cancel;
    }
    auto deferred = std::make_shared<Napi::Promise::Deferred>(env);
    Channel channel = open_channel(env, "a2d.generate");
    Ref();

    // `job` holds JS references: it is created, used and released on the JS thread only; the engine
    // thread reads its plain fields, which nothing else writes while the job runs.
    auto settle = [this, job, deferred, channel, token](a2d::GenerateResult result, std::string error) {
      auto shared = std::make_shared<a2d::GenerateResult>(std::move(result));
      post(channel, [this, job, deferred, token, shared, error](Napi::Env env) {
        {
          std::lock_guard<std::mutex> lock(cancel_mutex_);
          cancel_flags_.erase(token);
        }
        job->on_block.Reset();
        try {
          if (!error.empty()) throw Napi::Error::New(env, error);
          if (!job->callback_error.empty()) throw Napi::Error::New(env, job->callback_error);
          deferred->Resolve(result_object(env, *shared));
        } catch (const Napi::Error& e) {
          deferred->Reject(e.Value());
        }
        Unref();
      });
      channel.Release();
    };
    thread_.enqueue([this, job, channel, settle] {
      auto generation = std::make_unique<Generation>();
      generation->job = job;
      generation->settle = settle;
      auto on_block = [job, channel](const std::vector<int32_t>& tokens, int64_t forward_passes) {
        if (job->on_block.IsEmpty()) return;
        post(channel, [job, tokens, forward_passes](Napi::Env env) {
          if (!job->callback_error.empty()) return;
          try {
            Napi::Object event = Napi::Object::New(env);
            event.Set("tokens", int_array(env, tokens));
            event.Set("forwardPasses", static_cast<double>(forward_passes));
            job->on_block.Call({event});
          } catch (const Napi::Error& e) {
            job->callback_error = std::string("onBlock threw: ") + e.Message();
            job->cancel->store(true);
          }
        });
      };
      try {
        if (backend_ == nullptr) throw std::runtime_error("the engine is closed");
        generation->sequence = std::make_unique<a2d::Sequence>(*backend_, job->prompt, job->params, on_block);
      } catch (const std::exception& e) {
        settle({}, e.what());
        return;
      }
      queue_.push_back(Queued{std::move(generation), nullptr});
    });
    return deferred->Promise();
  }

  Napi::Value Cancel(const Napi::CallbackInfo& info) {
    if (info.Length() < 1 || !info[0].IsNumber()) throw Napi::TypeError::New(info.Env(), "cancel(token: number)");
    std::lock_guard<std::mutex> lock(cancel_mutex_);
    auto it = cancel_flags_.find(info[0].As<Napi::Number>().DoubleValue());
    if (it != cancel_flags_.end()) it->second->store(true);
    return info.Env().Undefined();
  }

  Napi::Value ForwardLogits(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    ensure_open(env);
    if (info.Length() < 3) throw Napi::TypeError::New(env, "forwardLogits(cached, commit, window: Int32Array)");
    auto cached = int32_array(info[0], "cachedIds");
    auto commit = int32_array(info[1], "commitIds");
    auto window = int32_array(info[2], "windowIds");
    // Runs while no generation does, on slot 0 (a generation taking it later resets it).
    return run_async<std::vector<float>>(
        env, "a2d.forwardLogits",
        [this, cached, commit, window](const Channel&) {
          a2d::Backend& backend = *backend_;
          const int64_t vocab = backend.config().vocab_size;
          const int64_t needed = static_cast<int64_t>(cached.size() + commit.size() + window.size());
          if (needed > backend.max_context()) {
            throw std::runtime_error(std::to_string(needed) + " tokens exceed the engine's context of " +
                                     std::to_string(backend.max_context()));
          }
          backend.reset_cache();
          if (!cached.empty()) {
            a2d::ForwardArgs prefix;
            prefix.commit = cached;
            backend.forward(prefix, nullptr);
            total_forwards_.fetch_add(1);
          }
          a2d::ForwardArgs args;
          args.commit = commit;
          args.window = window;
          for (int32_t r = 0; r < static_cast<int32_t>(commit.size() + window.size()); ++r) args.logit_rows.push_back(r);
          std::vector<float> logits(args.logit_rows.size() * vocab);
          backend.forward(args, logits.data());
          total_forwards_.fetch_add(1);
          return logits;
        },
        [](Napi::Env env, std::vector<float>& logits) -> Napi::Value {
          auto array = Napi::Float32Array::New(env, logits.size());
          std::copy(logits.begin(), logits.end(), array.Data());
          return array;
        });
  }

  Napi::Value TotalForwardPasses(const Napi::CallbackInfo& info) {
    return Napi::Number::New(info.Env(), static_cast<double>(total_forwards_.load()));
  }

  // Cancels running and queued generations, then frees the model on its thread once they have left.
  Napi::Value Close(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (closed_) {
      auto deferred = Napi::Promise::Deferred::New(env);
      deferred.Resolve(env.Undefined());
      return deferred.Promise();
    }
    closed_ = true;
    cancel_all();
    return run_async<bool>(
        env, "a2d.close",
        [this](const Channel&) {
          release_model();
          return true;
        },
        [](Napi::Env env, bool&) -> Napi::Value { return env.Undefined(); });
  }

  void cancel_all() {
    std::lock_guard<std::mutex> lock(cancel_mutex_);
    for (auto& [token, flag] : cancel_flags_) flag->store(true);
  }

  std::unique_ptr<a2d::Model> model_;      // engine thread only
  std::unique_ptr<a2d::Backend> backend_;  // engine thread only
  std::unique_ptr<a2d::BatchDecoder> batch_;  // engine thread only
  std::deque<Queued> queue_;                  // engine thread only
  std::map<uint64_t, std::unique_ptr<Generation>> running_;  // engine thread only: by batch id
  uint64_t next_id_ = 0;                                      // engine thread only
  std::atomic<int64_t> total_forwards_{0};
  std::mutex cancel_mutex_;
  std::map<double, std::shared_ptr<std::atomic<bool>>> cancel_flags_;
  bool closed_ = false;  // JS thread only
  EngineThread thread_{[this] { return work(); }};  // last: joined before the members above are destroyed
};

Napi::Value Load(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 5 || !info[0].IsString() || !info[1].IsString() || !info[2].IsNumber() ||
      !info[3].IsNumber() || !info[4].IsNumber()) {
    throw Napi::TypeError::New(env, "load(modelDir: string, device: string, threads: number, maxContext: number, maxBatch: number)");
  }
  const std::string device = info[1].As<Napi::String>().Utf8Value();
  if (device != "cpu" && device != "cuda") {
    throw Napi::TypeError::New(env, "device must be 'cpu' or 'cuda'");
  }
  Napi::Object object = env.GetInstanceData<Napi::FunctionReference>()->New({});
  NativeEngine* engine = Napi::ObjectWrap<NativeEngine>::Unwrap(object);
  return engine->StartLoad(env, info[0].As<Napi::String>().Utf8Value(), device,
                           info[2].As<Napi::Number>().Int32Value(),
                           static_cast<int64_t>(info[3].As<Napi::Number>().DoubleValue()),
                           info[4].As<Napi::Number>().Int32Value());
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  Napi::Function constructor = NativeEngine::Define(env);
  env.SetInstanceData(new Napi::FunctionReference(Napi::Persistent(constructor)));
  exports.Set("load", Napi::Function::New(env, Load, "load"));
#ifdef A2D_CUDA
  exports.Set("cuda", true);
#else
  exports.Set("cuda", false);
#endif
  return exports;
}

}  // namespace

NODE_API_MODULE(a2d, Init)
