// AudioWorklet processors for the realtime_gw page (plain JS, no build step).
//
// "capture": microphone at the context rate -> PCM16 mono at 24 kHz, posted in 20 ms chunks.
// "playback": 24 kHz PCM16 frames of the replies -> the context rate, through a jitter buffer that
//             prebuffers, reports what was actually played per response (for playback.ack and
//             conversation.item.truncate) and counts underruns.
// "meter": the page's ear on a WebRTC call's reply track (see below).
// Both resample in the worklet, so the page runs at whatever rate the sound card has (Firefox refuses
// to connect a microphone to an AudioContext of another rate).

const WIRE_RATE = 24000;

// RBJ-cookbook biquad low-pass: keeps what downsampling would fold back into the speech band out.
class LowPass {
  constructor(cutoff, rate) {
    const w = (2 * Math.PI * cutoff) / rate;
    const alpha = Math.sin(w) / (2 * Math.SQRT1_2);
    const cos = Math.cos(w);
    const a0 = 1 + alpha;
    this.b0 = (1 - cos) / 2 / a0;
    this.b1 = (1 - cos) / a0;
    this.b2 = this.b0;
    this.a1 = (-2 * cos) / a0;
    this.a2 = (1 - alpha) / a0;
    this.x1 = this.x2 = this.y1 = this.y2 = 0;
  }
  step(x) {
    const y = this.b0 * x + this.b1 * this.x1 + this.b2 * this.x2 - this.a1 * this.y1 - this.a2 * this.y2;
    this.x2 = this.x1; this.x1 = x; this.y2 = this.y1; this.y1 = y;
    return y;
  }
}

class CaptureProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / WIRE_RATE; // input samples per output sample
    this.filters = this.step > 1 ? [new LowPass(0.45 * WIRE_RATE, sampleRate), new LowPass(0.45 * WIRE_RATE, sampleRate)] : [];
    this.pos = 0; // fractional read position relative to the current block
    this.prev = 0; // last sample of the previous block (for interpolation across blocks)
    this.chunk = new Int16Array(WIRE_RATE / 50); // 20 ms
    this.fill = 0;
    this.enabled = true;
    this.port.onmessage = (e) => { if (e.data.type === 'enable') this.enabled = e.data.value; };
  }
  process(inputs) {
    const input = inputs[0];
    if (!input || input.length === 0) return true;
    const ch = input[0];
    const n = ch.length;
    const x = new Float32Array(n + 1);
    x[0] = this.prev;
    for (let i = 0; i < n; i++) {
      let v = ch[i];
      for (const f of this.filters) v = f.step(v);
      x[i + 1] = v;
    }
    this.prev = x[n];
    // x[0] is the previous block's last sample: output positions run over (0, n].
    while (this.pos < n) {
      const t = this.pos + 1;
      const i = Math.floor(t);
      const frac = t - i;
      const v = i < n ? x[i] + (x[i + 1] - x[i]) * frac : x[n];
      const s = Math.max(-1, Math.min(1, v));
      this.chunk[this.fill++] = s < 0 ? s * 32768 : s * 32767;
      if (this.fill === this.chunk.length) {
        if (this.enabled) this.port.postMessage({ type: 'pcm', pcm: this.chunk.buffer }, [this.chunk.buffer]);
        this.chunk = new Int16Array(WIRE_RATE / 50);
        this.fill = 0;
      }
      this.pos += this.step;
    }
    this.pos -= n;
    return true;
  }
}

class PlaybackProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = (options && options.processorOptions) || {};
    this.prebuffer = Math.round(((opts.prebufferMs || 120) * WIRE_RATE) / 1000);
    this.step = WIRE_RATE / sampleRate; // wire samples per output sample
    this.queue = []; // {rid, pcm: Int16Array, off}
    this.queued = 0; // wire samples queued
    this.playing = false;
    this.pos = 0; // fractional position into the head frame
    this.last = 0;
    this.streams = new Map(); // rid -> {played, ended, muted}
    this.current = null;
    this.underruns = 0;
    this.sinceReport = 0;
    this.port.onmessage = (e) => this.onMessage(e.data);
  }
  stream(rid) {
    let s = this.streams.get(rid);
    if (!s) { s = { played: 0, ended: false, muted: false, started: false }; this.streams.set(rid, s); }
    return s;
  }
  onMessage(m) {
    if (m.type === 'frame') {
      const s = this.stream(m.rid);
      if (s.muted) return;
      const pcm = new Int16Array(m.pcm);
      this.queue.push({ rid: m.rid, pcm, off: 0 });
      this.queued += pcm.length;
    } else if (m.type === 'end') {
      this.stream(m.rid).ended = true;
    } else if (m.type === 'flush') {
      // Barge-in: drop what is queued (of one response, or everything); later frames are ignored.
      this.queue = this.queue.filter((q) => m.rid && q.rid !== m.rid);
      this.queued = this.queue.reduce((a, q) => a + q.pcm.length - q.off, 0);
      for (const [rid, s] of this.streams) if (!m.rid || rid === m.rid) { s.muted = true; s.ended = true; }
      if (!this.queue.length) this.playing = false;
      this.report();
    } else if (m.type === 'forget') {
      this.streams.delete(m.rid);
    }
  }
  allEnded() {
    for (const s of this.streams.values()) if (!s.ended) return false;
    return true;
  }
  next() {
    // One wire sample from the head of the queue, or null when dry.
    while (this.queue.length) {
      const head = this.queue[0];
      if (head.off < head.pcm.length) {
        const s = this.stream(head.rid);
        if (!s.started) { s.started = true; this.port.postMessage({ type: 'started', rid: head.rid, at: currentTime }); }
        s.played++;
        this.current = head.rid;
        this.queued--;
        return head.pcm[head.off++] / 32768;
      }
      this.queue.shift();
    }
    return null;
  }
  process(_inputs, outputs) {
    const out = outputs[0][0];
    if (!this.playing && this.queue.length && (this.queued >= this.prebuffer || this.allEnded())) this.playing = true;
    for (let i = 0; i < out.length; i++) {
      if (!this.playing) { out[i] = 0; continue; }
      // Linear interpolation between consecutive wire samples (upsampling: no filter needed).
      this.pos += this.step;
      while (this.pos >= 1) {
        const v = this.next();
        if (v === null) {
          if (!this.allEnded()) this.underruns++;
          this.playing = false; // prebuffer again rather than stutter
          break;
        }
        this.prevSample = this.last;
        this.last = v;
        this.pos -= 1;
      }
      const a = this.prevSample || 0;
      out[i] = this.playing ? a + (this.last - a) * this.pos : 0;
    }
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    this.sinceReport += out.length;
    if (this.sinceReport >= sampleRate / 20) this.report(); // every 50 ms
    return true;
  }
  report() {
    this.sinceReport = 0;
    const played = {};
    for (const [rid, s] of this.streams) played[rid] = (s.played * 1000) / WIRE_RATE;
    const queuedRids = new Set(this.queue.map((q) => q.rid));
    const finished = [];
    for (const [rid, s] of this.streams) if (s.ended && !queuedRids.has(rid)) finished.push(rid);
    this.port.postMessage({
      type: 'status', current: this.current, played, finished,
      playing: this.playing, bufferedMs: (this.queued * 1000) / WIRE_RATE, underruns: this.underruns,
    });
  }
}

// "meter": once armed (a message naming a response), posts {type: 'loud', rid} at the first block louder
// than -34 dBFS: when a WebRTC reply's sound reaches the page's audio graph (the speaker's input).
class MeterProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.armed = null;
    this.port.onmessage = (e) => { this.armed = e.data.rid; };
  }
  process(inputs) {
    const ch = inputs[0] && inputs[0][0];
    if (this.armed != null && ch) {
      let peak = 0;
      for (let i = 0; i < ch.length; i++) peak = Math.max(peak, Math.abs(ch[i]));
      if (peak > 0.02) {
        this.port.postMessage({ type: 'loud', rid: this.armed });
        this.armed = null;
      }
    }
    return true;
  }
}

registerProcessor('capture', CaptureProcessor);
registerProcessor('meter', MeterProcessor);
registerProcessor('playback', PlaybackProcessor);
