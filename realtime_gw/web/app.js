// realtime_gw browser client: microphone -> gateway -> speaker, with live latency figures. Two
// transports: a WebRTC call (POST /v1/realtime/calls: Opus tracks, events on the 'oai-events' data
// channel; the default) or the /v1/realtime WebSocket (base64 PCM in events; ?transport=websocket).
// Plain JS, no build step. State is kept on window.rtgw so tests (and curious people) can read it.
// ?model=NAME picks the session's model; ?model=gateway-echo says back what the microphone hears (an
// audio path check; each echo's delay from the microphone is in echoLoopMs). ?vad=0 starts without server VAD.
// ?processing=0 turns the browser's microphone processing off.
'use strict';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const FRAME_MS = 80;
const MODEL = params.get('model') || '';
const ECHO = MODEL === 'gateway-echo'; // the reply is the user's own voice: it never barges in on itself
const modelQuery = MODEL ? `?model=${encodeURIComponent(MODEL)}` : '';
// ?processing=0: the microphone as it is (no echo cancellation, noise suppression or gain control: with
// gateway-echo, use headphones); the echo's onsets are then timed at the meter's own threshold
const PROCESSING = params.get('processing') !== '0';
const ONSET_PEAK = ECHO ? 655 : 1600; // the meter's threshold (0.02 of full scale) for the echo

const state = (window.rtgw = {
  status: 'idle', sessionId: null, capabilities: {}, supportsAck: false,
  userTranscripts: [], assistantTranscripts: [], errors: [],
  framesReceived: 0, lostFrames: 0, duplicateFrames: 0, playedMs: 0, underruns: 0, bufferedMs: 0,
  ttfaMs: [], turnLatencyMs: [], heardLatencyMs: [], maxLatenessMs: 0, bargeIns: 0, acksSent: 0,
  micMsSent: 0, responses: 0, truncated: [], cancelled: 0,
  transport: params.get('transport') || 'webrtc', callId: null, rtc: { started: [], stopped: [], cleared: [] },
  // when each reply was first heard, the microphone's first sample and its speech onsets (page clock)
  heardAtMs: [], captureStartMs: null, micOnsetsMs: [],
  // WebRTC: the browser's jitter buffer on the reply track (getStats): mean delay, share concealed
  jitterBufferMs: null, concealedPct: null,
  // gateway-echo: from each sound's onset at the microphone to its echo at the page's audio graph
  echoLoopMs: [],
});

let ws = null;
let pc = null; // the WebRTC call
let dc = null; // its 'oai-events' data channel
let ctx = null;
let mic = null;
let captureNode = null;
let playbackNode = null;
let meterNode = null; // WebRTC: hears when a reply's sound arrives
let statsTimer = null;
let micLoudAt = null;
let echoAwaited = false; // gateway-echo: the meter waits for an onset's echo
const replies = new Map(); // response id -> {itemId, created, firstAt, nextSeq, done, line, played}
let current = null; // response id being generated
let heardRid = null; // response id whose audio is at the speaker
let speechStoppedAt = null;
let ackTimer = null;
const acked = new Map();
let playedDone = 0;

const now = () => performance.now();
const fmt = (ms) => (ms == null ? '–' : `${Math.round(ms)} ms`);
const median = (xs) => (xs.length ? [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] : null);

function setStatus(s) { state.status = s; $('status').textContent = s; }

function line(cls, text) {
  const div = document.createElement('div');
  div.className = `msg ${cls}`;
  div.textContent = text;
  $('log').appendChild(div);
  $('log').scrollTop = $('log').scrollHeight;
  return div;
}

function render() {
  $('f-session').textContent = state.sessionId || '–';
  const last = (xs) => (xs.length ? xs[xs.length - 1] : null);
  $('f-ttfa').textContent = `${fmt(last(state.ttfaMs))} (median ${fmt(median(state.ttfaMs))})`;
  $('f-turn').textContent = `${fmt(last(state.turnLatencyMs))} (median ${fmt(median(state.turnLatencyMs))})`;
  $('f-heard').textContent = fmt(last(state.heardLatencyMs));
  $('f-late').textContent = fmt(state.maxLatenessMs);
  $('f-buffer').textContent = fmt(state.bufferedMs);
  $('f-frames').textContent = `${state.framesReceived} / ${state.lostFrames}`;
  $('f-underruns').textContent = String(state.underruns);
  $('f-barge').textContent = String(state.bargeIns);
  $('f-acks').textContent = state.supportsAck ? String(state.acksSent) : 'not offered';
  $('f-sent').textContent = `${(state.micMsSent / 1000).toFixed(1)} s`;
}

function send(event) {
  if (dc && dc.readyState === 'open') dc.send(JSON.stringify(event));
  else if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(event));
}

// -- WebRTC call --------------------------------------------------------------------------------------
// The key field may hold a deployment key or an ephemeral client secret (ek_...), minted by the app's
// backend with POST /v1/realtime/client_secrets: a browser should only ever hold the latter.
async function startCall(key) {
  pc = new RTCPeerConnection({ iceServers: [] });
  for (const track of mic.getAudioTracks()) pc.addTrack(track, mic);
  dc = pc.createDataChannel('oai-events');
  dc.onmessage = (e) => onEvent(JSON.parse(e.data));
  dc.onclose = () => { setStatus('call ended'); cleanup(); };
  pc.ontrack = (e) => {
    const speaker = $('speaker');
    speaker.srcObject = e.streams[0] || new MediaStream([e.track]);
    speaker.play().catch((err) => line('error', `playback: ${err}`));
    ctx.createMediaStreamSource(speaker.srcObject).connect(meterNode);
  };
  statsTimer = setInterval(readTrackStats, 1000);
  pc.onconnectionstatechange = () => {
    if (pc && pc.connectionState === 'failed') { line('error', 'call failed (no route to the gateway?)'); stop(); }
  };
  await pc.setLocalDescription(await pc.createOffer());
  const headers = { 'Content-Type': 'application/sdp' };
  if (key) headers.Authorization = `Bearer ${key}`;
  const resp = await fetch(`/v1/realtime/calls${modelQuery}`, { method: 'POST', body: pc.localDescription.sdp, headers });
  if (resp.status !== 201) throw new Error(`call refused: ${resp.status} ${await resp.text()}`);
  state.callId = (resp.headers.get('Location') || '').split('/').pop();
  await pc.setRemoteDescription({ type: 'answer', sdp: await resp.text() });
}

function b64FromInt16(buf) {
  const bytes = new Uint8Array(buf);
  let s = '';
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

function int16FromB64(b64) {
  const s = atob(b64);
  const bytes = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) bytes[i] = s.charCodeAt(i);
  return bytes.buffer;
}

// -- barge-in ---------------------------------------------------------------------------------------
// Stop playback at once and tell the server how much was heard. The server cancels the response itself
// when its VAD heard us (interrupt_response); from the Interrupt button we cancel first, then truncate
// (this server also cancels on a truncate of a live item, so the reverse order would earn an error).
function bargeIn(cancel) {
  const rid = heardRid && replies.get(heardRid) && !replies.get(heardRid).finishedPlaying ? heardRid : current;
  if (!rid) return;
  const r = replies.get(rid);
  playbackNode.port.postMessage({ type: 'flush', rid });
  if (cancel && !r.done) send({ type: 'response.cancel', response_id: rid });
  if (r.itemId) {
    send({ type: 'conversation.item.truncate', item_id: r.itemId, content_index: 0, audio_end_ms: Math.floor(r.played || 0) });
  }
  r.finishedPlaying = true;
  state.bargeIns += 1;
  line('meta', `barge-in at ${Math.floor(r.played || 0)} ms of ${rid}`);
}

// -- server events ------------------------------------------------------------------------------------
function onEvent(ev) {
  const t = now();
  switch (ev.type) {
    case 'session.created':
      state.sessionId = ev.session.id;
      state.capabilities = ev.session.capabilities || {};
      state.supportsAck = !!state.capabilities.supports_playback_ack;
      send({
        type: 'session.update',
        session: {
          type: 'realtime',
          audio: {
            input: {
              format: { type: 'audio/pcm', rate: 24000 },
              transcription: { model: 'default' },
              turn_detection: $('vad').checked ? { type: 'server_vad', silence_duration_ms: 500, interrupt_response: !ECHO } : null,
            },
          },
        },
      });
      break;
    case 'session.updated':
      setStatus('listening');
      break;
    case 'input_audio_buffer.speech_started':
      setStatus('hearing you');
      if (!ECHO && heardRid && replies.get(heardRid) && !replies.get(heardRid).finishedPlaying) bargeIn(false);
      break;
    case 'input_audio_buffer.speech_stopped':
      speechStoppedAt = t;
      setStatus('thinking');
      break;
    case 'conversation.item.input_audio_transcription.completed':
      state.userTranscripts.push(ev.transcript);
      line('user', ev.transcript || '(nothing recognised)');
      break;
    case 'response.created':
      current = ev.response.id;
      state.responses += 1;
      replies.set(current, { created: t, turnEnd: speechStoppedAt, firstAt: null, nextSeq: 0, done: false, line: null, played: 0, text: '' });
      speechStoppedAt = null;
      break;
    case 'response.output_item.added': {
      const r = replies.get(ev.response_id);
      if (r) r.itemId = ev.item.id;
      break;
    }
    case 'response.output_audio.delta': {
      const r = replies.get(ev.response_id);
      if (!r) break;
      const seq = ev.seq ?? r.nextSeq;
      if (seq < r.nextSeq) { state.duplicateFrames += 1; break; }
      state.lostFrames += seq - r.nextSeq;
      r.nextSeq = seq + 1;
      state.framesReceived += 1;
      if (r.firstAt === null) {
        r.firstAt = t;
        state.ttfaMs.push(t - r.created);
        if (r.turnEnd != null) state.turnLatencyMs.push(t - r.turnEnd);
        setStatus('speaking');
      } else {
        state.maxLatenessMs = Math.max(state.maxLatenessMs, t - (r.firstAt + seq * FRAME_MS));
      }
      const pcm = int16FromB64(ev.delta);
      playbackNode.port.postMessage({ type: 'frame', rid: ev.response_id, seq, pcm }, [pcm]);
      break;
    }
    case 'response.output_audio_transcript.delta':
    case 'response.output_text.delta': {
      const r = replies.get(ev.response_id);
      if (!r) break;
      r.text += ev.delta;
      if (!r.line) r.line = line('assistant', '');
      r.line.textContent = r.text;
      break;
    }
    case 'response.done': {
      const r = replies.get(ev.response.id);
      if (r) {
        r.done = true;
        if (r.text) state.assistantTranscripts.push(r.text);
        if (ev.response.status === 'cancelled') state.cancelled += 1;
        if (ev.response.status !== 'completed') line('meta', `response ${ev.response.status}`);
        if (r.finishedPlaying) forget(ev.response.id);
      }
      playbackNode.port.postMessage({ type: 'end', rid: ev.response.id });
      if (current === ev.response.id) current = null;
      break;
    }
    case 'output_audio_buffer.started': { // WebRTC: the reply's first frame is on the track
      state.rtc.started.push(ev.response_id);
      const r = replies.get(ev.response_id);
      if (r) {
        heardRid = ev.response_id;
        state.ttfaMs.push(t - r.created);
        if (!ECHO) meterNode.port.postMessage({ rid: ev.response_id }); // heard when its sound arrives
      }
      setStatus('speaking');
      break;
    }
    case 'output_audio_buffer.stopped':
      state.rtc.stopped.push(ev.response_id);
      if (!current) setStatus('listening');
      break;
    case 'output_audio_buffer.cleared':
      state.rtc.cleared.push(ev.response_id);
      break;
    case 'conversation.item.truncated':
      state.truncated.push({ itemId: ev.item_id, audioEndMs: ev.audio_end_ms });
      break;
    case 'error':
      state.errors.push(ev.error);
      line('error', `${ev.error.code || ev.error.type}: ${ev.error.message}`);
      break;
    default:
      break;
  }
  render();
}

// -- playback status from the worklets ----------------------------------------------------------------
function heard(rid) {
  if (ECHO && typeof rid === 'string' && rid.startsWith('onset-')) { // the meter, armed at the onset
    echoAwaited = false;
    state.echoLoopMs.push(now() - state.micOnsetsMs[Number(rid.slice(6))]);
    state.heardAtMs.push(now());
    render();
    return;
  }
  if (ECHO) return; // echo replies are timed by the meter from their onset
  const r = replies.get(rid);
  state.heardAtMs.push(now());
  if (r && r.turnEnd != null) state.heardLatencyMs.push(now() - r.turnEnd);
  render();
}

async function readTrackStats() {
  if (!pc) return;
  (await pc.getStats()).forEach((s) => {
    if (s.type !== 'inbound-rtp' || s.kind !== 'audio' || !s.jitterBufferEmittedCount) return;
    state.jitterBufferMs = (1000 * s.jitterBufferDelay) / s.jitterBufferEmittedCount;
    state.concealedPct = s.totalSamplesReceived ? (100 * s.concealedSamples) / s.totalSamplesReceived : 0;
  });
}

function onPlayback(m) {
  if (m.type === 'started') {
    heardRid = m.rid;
    heard(m.rid);
    return;
  }
  if (m.type !== 'status') return;
  state.bufferedMs = m.bufferedMs;
  state.underruns = m.underruns;
  let live = 0;
  for (const [rid, ms] of Object.entries(m.played)) {
    const r = replies.get(rid);
    if (!r) continue; // forgotten here already; the worklet hears of it next
    r.played = ms;
    live += ms;
  }
  state.playedMs = playedDone + live; // everything heard so far, over all responses
  for (const rid of m.finished) {
    const r = replies.get(rid);
    if (r && !r.finishedPlaying) {
      r.finishedPlaying = true;
      if (state.supportsAck) ack(rid, r.played); // the final position
    }
    if (!r || r.done) forget(rid);
  }
  if (!m.playing && !current && ['speaking'].includes(state.status)) setStatus('listening');
  render();
}

// Drop a reply once it is both finished on the server and played (or flushed) here. Not earlier: the
// worklet would take late frames of a flushed reply for a new stream and play them.
function forget(rid) {
  const r = replies.get(rid);
  if (r) playedDone += r.played || 0;
  replies.delete(rid);
  acked.delete(rid);
  playbackNode.port.postMessage({ type: 'forget', rid });
}

function ack(rid, played) {
  const ms = Math.floor(played || 0);
  if (ms <= (acked.get(rid) ?? -1)) return;
  acked.set(rid, ms);
  send({ type: 'playback.ack', response_id: rid, played_ms: ms });
  state.acksSent += 1;
}

// -- start / stop -----------------------------------------------------------------------------------
async function start() {
  $('start').disabled = true;
  const key = $('key').value.trim();
  localStorage.setItem('rtgw-key', key);
  try {
    setStatus('starting audio');
    ctx = new AudioContext({ latencyHint: 'interactive' });
    await ctx.audioWorklet.addModule('/web/audio-worklets.js');
    mic = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: PROCESSING, noiseSuppression: PROCESSING, autoGainControl: PROCESSING },
    });
    const source = ctx.createMediaStreamSource(mic);
    captureNode = new AudioWorkletNode(ctx, 'capture', { numberOfInputs: 1, numberOfOutputs: 1 });
    playbackNode = new AudioWorkletNode(ctx, 'playback', { numberOfInputs: 0, numberOfOutputs: 1, outputChannelCount: [1], processorOptions: { prebufferMs: 120 } });
    const sink = ctx.createGain();
    sink.gain.value = 0; // the capture node must be pulled by the graph, but not heard
    source.connect(captureNode).connect(sink).connect(ctx.destination);
    playbackNode.connect(ctx.destination);
    playbackNode.port.onmessage = (e) => onPlayback(e.data);
    meterNode = new AudioWorkletNode(ctx, 'meter', { numberOfInputs: 1, numberOfOutputs: 1 });
    meterNode.connect(sink);
    if (ECHO) playbackNode.connect(meterNode); // the WebSocket's replies, measured where the call's are
    meterNode.port.onmessage = (e) => heard(e.data.rid);
    captureNode.port.onmessage = (e) => {
      if (e.data.type !== 'pcm') return;
      const pcm = new Int16Array(e.data.pcm);
      if (state.captureStartMs == null) state.captureStartMs = now() - (pcm.length * 1000) / 24000;
      let peak = 0;
      for (let i = 0; i < pcm.length; i += 8) peak = Math.max(peak, Math.abs(pcm[i]));
      if (peak > ONSET_PEAK) { // sound at the microphone after a second of quiet: an onset
        if (micLoudAt == null || now() - micLoudAt > 1000) {
          state.micOnsetsMs.push(now());
          // the echo's first sound at the page's audio graph, whatever the transport, is this onset's
          // (one at a time: an onset while the last echo is still awaited is not timed, never mispaired)
          if (ECHO && !echoAwaited) {
            echoAwaited = true;
            meterNode.port.postMessage({ rid: `onset-${state.micOnsetsMs.length - 1}` });
          }
        }
        micLoudAt = now();
      }
      $('level').value = peak / 32768;
      if (ws && ws.readyState === WebSocket.OPEN && state.sessionId) {
        send({ type: 'input_audio_buffer.append', audio: b64FromInt16(e.data.pcm) });
        state.micMsSent += (pcm.length * 1000) / 24000;
      }
    };
    await ctx.resume();

    setStatus('connecting');
    if (state.transport === 'webrtc') {
      await startCall(key);
      for (const id of ['stop', 'interrupt', 'send', 'text']) $(id).disabled = false;
      return;
    }
    const url = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/v1/realtime${modelQuery}`;
    // Browsers cannot set headers on a WebSocket: the key travels as a subprotocol, as with OpenAI's API.
    const protocols = key ? ['realtime', `openai-insecure-api-key.${key}`] : ['realtime'];
    ws = new WebSocket(url, protocols);
    ws.onmessage = (e) => onEvent(JSON.parse(e.data));
    ws.onclose = (e) => { setStatus(`closed (${e.code}${e.reason ? ': ' + e.reason : ''})`); cleanup(); };
    ws.onerror = () => line('error', 'WebSocket error');
    ackTimer = setInterval(() => {
      if (state.supportsAck && heardRid && replies.has(heardRid)) ack(heardRid, replies.get(heardRid).played);
    }, 200);
    for (const id of ['stop', 'interrupt', 'send', 'text']) $(id).disabled = false;
  } catch (err) {
    state.errors.push({ message: String(err) });
    line('error', String(err));
    setStatus('failed');
    cleanup();
  }
}

function cleanup() {
  if (ackTimer) clearInterval(ackTimer);
  if (statsTimer) clearInterval(statsTimer);
  ackTimer = statsTimer = null;
  if (mic) mic.getTracks().forEach((t) => t.stop());
  if (pc) pc.close();
  pc = dc = null;
  if (ctx) ctx.close();
  mic = ctx = null;
  $('start').disabled = false;
  for (const id of ['stop', 'interrupt', 'send', 'text']) $(id).disabled = true;
}

function stop() {
  if (pc && state.callId) {
    const key = $('key').value.trim();
    fetch(`/v1/realtime/calls/${state.callId}/hangup`, { method: 'POST', headers: key ? { Authorization: `Bearer ${key}` } : {} });
  }
  if (ws) ws.close(1000, 'bye');
  ws = null;
  setStatus('stopped');
  cleanup();
}

function sendText() {
  const text = $('text').value.trim();
  if (!text) return;
  $('text').value = '';
  line('user', text);
  state.userTranscripts.push(text);
  if (current) bargeIn(true);
  send({ type: 'conversation.item.create', item: { type: 'message', role: 'user', content: [{ type: 'input_text', text }] } });
  send({ type: 'response.create' });
}

$('key').value = params.get('key') || localStorage.getItem('rtgw-key') || '';
if (params.get('vad') === '0') $('vad').checked = false;
$('start').onclick = start;
$('stop').onclick = stop;
$('interrupt').onclick = () => {
  if (!pc) { bargeIn(true); return; }
  // A call: the gateway stops its track and truncates the reply to what it sent.
  send({ type: 'output_audio_buffer.clear' });
  state.bargeIns += 1;
};
$('transport').value = state.transport;
$('transport').onchange = () => { state.transport = $('transport').value; };
$('send').onclick = sendText;
$('text').onkeydown = (e) => { if (e.key === 'Enter') sendText(); };
render();
