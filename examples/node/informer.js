#!/usr/bin/env node
// An informer for watchproxy in Node.js (@grpc/grpc-js): list, then watch
// from the list's resource version with a selector, keeping a local copy of
// the objects.
//
// After a disconnect it resumes from the last resource version it has every
// event of (or the one the server names in
// `watchproxy-resume-resource-version`); on OUT_OF_RANGE ("too old resource
// version") it lists again. A watch the server ends for its credential
// (CREDENTIAL_EXPIRED, CREDENTIAL_REVOKED) or a change of the rules
// (ACCESS_CHANGED) resumes from the version the status names, with the
// token read again from --token-file. Between retries it waits as the
// server's RetryInfo advises, never less, with jittered exponential backoff.
// The proto is loaded at start.
//
//     npm ci --prefix examples/node
//     node examples/node/informer.js 127.0.0.1:50051 pods --selector app=web
//
// It logs one JSON object per line on stderr and prints each change on
// stdout as a JSON line ({"type","key","resource_version"}); with --until
// NAME it prints nothing until an object of that name is seen, then exits,
// printing the copy.
'use strict';

const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { Reader } = require('protobufjs');

const PROTO = path.join(__dirname, '..', '..', 'proto', 'watchproxy', 'v1', 'watchproxy.proto');

function log(fields) {
  process.stderr.write(JSON.stringify(fields) + '\n');
}

function parseArgs(argv) {
  const args = { selector: '', fieldSelector: '', until: null, tokenFile: null, positional: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--selector') args.selector = argv[++i] ?? '';
    else if (a === '--field-selector') args.fieldSelector = argv[++i] ?? '';
    else if (a === '--until') args.until = argv[++i] ?? null;
    else if (a === '--token-file') args.tokenFile = argv[++i] ?? null;
    else args.positional.push(a);
  }
  if (args.positional.length !== 2) {
    process.stderr.write('usage: informer.js SERVER RESOURCE [--selector S] [--field-selector F] [--until NAME] [--token-file F]\n');
    process.exit(2);
  }
  [args.server, args.resource] = args.positional;
  return args;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

const ERROR_INFO = 'type.googleapis.com/google.rpc.ErrorInfo';
const RETRY_INFO = 'type.googleapis.com/google.rpc.RetryInfo';

/** The fields of a protobuf message: number -> [values] (bytes, and varints as numbers). */
function fields(bytes) {
  const r = Reader.create(bytes);
  const out = {};
  while (r.pos < r.len) {
    const tag = r.uint32();
    const [field, wire] = [tag >>> 3, tag & 7];
    let value = null;
    if (wire === 2) value = r.bytes();
    else if (wire === 0) value = Number(r.uint64().toString());
    else r.skipType(wire);
    (out[field] = out[field] || []).push(value);
  }
  return out;
}

/** The `details` of a status (google.rpc.Status in the `grpc-status-details-bin` trailer, field 3): type URL -> value. */
function details(err) {
  const [bin] = (err.metadata && err.metadata.get('grpc-status-details-bin')) || [];
  const out = {};
  if (!bin) return out;
  for (const any of fields(bin)[3] || []) {
    const f = fields(any);
    if (f[1] && f[2]) out[Buffer.from(f[1][0]).toString()] = f[2][0];
  }
  return out;
}

/** The ErrorInfo reason of a watchproxy status (its field 1). */
function reason(err) {
  const info = details(err)[ERROR_INFO];
  return info ? Buffer.from(fields(info)[1][0]).toString() : null;
}

/** The wait a status' RetryInfo advises, in ms (its retry_delay, a Duration of seconds and nanos). */
function retryMs(err) {
  const info = details(err)[RETRY_INFO];
  if (!info) return 0;
  const delay = fields(info)[1];
  if (!delay) return 0;
  const d = fields(delay[0]);
  return ((d[1] && d[1][0]) || 0) * 1000 + ((d[2] && d[2][0]) || 0) / 1e6;
}

/** Doubling waits up to 30 s, jittered in the upper half, never shorter than the server advises. */
class Backoff {
  constructor() {
    this.step = 200;
  }

  next(advisedMs) {
    const step = this.step;
    this.step = Math.min(step * 2, 30000);
    return Math.max(step / 2 + Math.random() * (step / 2), advisedMs || 0);
  }

  reset() {
    this.step = 200;
  }
}

// Ends the server gives an open watch for its credential or the rules: a
// fresh credential resumes it from the version the status names.
const CREDENTIAL_ENDS = new Set(['CREDENTIAL_EXPIRED', 'CREDENTIAL_REVOKED', 'ACCESS_CHANGED']);

class Informer {
  constructor(client, resource, selector, fieldSelector, tokenFile) {
    Object.assign(this, { client, resource, selector, fieldSelector, tokenFile });
    this.objects = new Map(); // key -> resource version
    // `version` has every event of its revision: a watch resumes from it.
    // One revision can carry several events (a transaction), so the last
    // event's version is complete only once a later revision or a bookmark
    // arrives.
    this.version = null;
    this.seen = null;
    this.lists = 0;
    this.resumes = 0;
    this.backoff = new Backoff();
  }

  /** The call's metadata: the token, read from its file for every call. */
  metadata() {
    const md = new grpc.Metadata();
    if (this.tokenFile) md.set('authorization', `Bearer ${fs.readFileSync(this.tokenFile, 'utf8').trim()}`);
    return md;
  }

  /** Pages of one consistent list replace the local copy. */
  async relist() {
    const objects = new Map();
    let token = '';
    let resp;
    for (;;) {
      try {
        resp = await new Promise((resolve, reject) =>
          this.client.List(
            {
              resource: this.resource,
              label_selector: this.selector,
              field_selector: this.fieldSelector,
              limit: 500,
              continue_token: token,
            },
            this.metadata(),
            (err, r) => (err ? reject(err) : resolve(r)),
          ),
        );
      } catch (err) {
        // Not ready yet, or a replica going away: the status says when to
        // retry (RetryInfo).
        if (err.code !== grpc.status.UNAVAILABLE) throw err;
        const wait = this.backoff.next(retryMs(err));
        log({ event: 'list unavailable; retrying', reason: reason(err), details: err.details,
              advised_ms: retryMs(err), retry_ms: Math.round(wait) });
        await sleep(wait);
        objects.clear();
        token = '';
        continue;
      }
      for (const o of resp.items) objects.set(o.key, o.resource_version);
      token = resp.continue_token;
      if (!token) break;
    }
    this.objects = objects;
    this.version = this.seen = resp.resource_version;
    this.lists += 1;
    this.backoff.reset();
    log({ event: 'listed', objects: objects.size, resource_version: this.version });
  }

  /** One watch stream: true once `until` was seen, false when it ended. */
  watch(until) {
    return new Promise((resolve, reject) => {
      let done = false;
      const call = this.client.Watch({
        resource: this.resource,
        label_selector: this.selector,
        field_selector: this.fieldSelector,
        resource_version: this.version,
        allow_bookmarks: true,
      }, this.metadata());
      call.on('data', (ev) => {
        this.backoff.reset();
        const rv = ev.object.resource_version;
        // Where to resume after the event: a resync's events name the
        // version its lost history starts from, while their objects keep
        // their own.
        const resume = ev.resume_resource_version || rv;
        if (ev.type === 'EVENT_TYPE_BOOKMARK') {
          this.version = this.seen = resume;
          return;
        }
        if (BigInt(resume) > BigInt(this.seen)) {
          this.version = this.seen;
          this.seen = resume;
        }
        if (ev.type === 'EVENT_TYPE_DELETED') this.objects.delete(ev.object.key);
        else this.objects.set(ev.object.key, rv);
        if (!until) {
          const type = ev.type.replace('EVENT_TYPE_', '');
          process.stdout.write(JSON.stringify({ type, key: ev.object.key, resource_version: rv }) + '\n');
        }
        if (until && ev.object.name === until && !done) {
          done = true;
          call.cancel();
          resolve(true);
        }
      });
      call.on('error', (err) => {
        if (!done) reject(err);
      });
      call.on('end', () => {
        if (!done) resolve(false);
      });
    });
  }

  async run(until) {
    await this.relist();
    for (;;) {
      try {
        if (await this.watch(until)) return;
      } catch (err) {
        if (err.code === grpc.status.OUT_OF_RANGE) {
          log({ event: 'too old; listing again', reason: reason(err), details: err.details });
          await this.relist();
          continue;
        }
        const why = reason(err);
        if (err.code === grpc.status.UNAVAILABLE || CREDENTIAL_ENDS.has(why)) {
          const named = err.metadata && err.metadata.get('watchproxy-resume-resource-version')[0];
          if (named) this.version = this.seen = String(named);
          this.resumes += 1;
          const wait = this.backoff.next(retryMs(err));
          log({ event: 'resuming', code: grpc.status[err.code], reason: why, resource_version: this.version,
                advised_ms: retryMs(err), retry_ms: Math.round(wait) });
          await sleep(wait);
          continue;
        }
        throw err;
      }
    }
  }
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const definition = protoLoader.loadSync(PROTO, {
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
  });
  const pkg = grpc.loadPackageDefinition(definition).watchproxy.v1;
  const client = new pkg.WatchProxy(args.server, grpc.credentials.createInsecure());
  const informer = new Informer(client, args.resource, args.selector, args.fieldSelector, args.tokenFile);
  await informer.run(args.until);
  process.stdout.write(
    JSON.stringify({
      objects: Object.fromEntries(informer.objects),
      lists: informer.lists,
      resumes: informer.resumes,
    }) + '\n',
  );
  client.close();
}

main().catch((err) => {
  log({ event: 'failed', error: String(err) });
  process.exit(1);
});
