# syntax=docker/dockerfile:1
# Node.js 24 (LTS), an exact release: bump it with each Node.js security release. package.json's
# "engines" (>=22.13) is the floor the code supports; the image runs the current LTS line.
ARG NODE_IMAGE=node:24.21.0-bookworm-slim

# Build stage: every dependency from the lockfile (esbuild and tsx are development ones), then
# the server bundle and the web console.
FROM ${NODE_IMAGE} AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --ignore-scripts --no-audit --no-fund
COPY scripts ./scripts
COPY src ./src
COPY web ./web
RUN node scripts/build.mjs

# Production dependencies only: no compiler, no test tools.
FROM ${NODE_IMAGE} AS deps
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund && npm cache clean --force

# Runtime: the bundled server (dist/parley.mjs), as `npm start` runs it, on production
# dependencies only; no sources, no root.
FROM ${NODE_IMAGE}
WORKDIR /app
COPY --from=deps /app/node_modules ./node_modules
COPY package.json ./
COPY bin ./bin
COPY migrations ./migrations
COPY --from=build /app/dist ./dist
COPY --from=build /app/web/dist ./web/dist
ENV HOST=0.0.0.0 \
    PORT=3000 \
    DATA_DIR=/app/data
RUN mkdir -p /app/data && chown node:node /app/data
USER node
EXPOSE 3000
# Liveness only: a database outage must not get the container restarted (it recovers by
# itself); load balancers probe /readyz for readiness.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:'+(process.env.PORT||3000)+'/healthz').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"]
# The V8 heap budget of `npm start` (package.json), which the tests' and benches' servers run
# with too. V8 lets garbage build up in proportion to its limits: left to itself it sizes the old
# generation from the machine's or container's memory (up to 4 GiB) and, on Node 24 on a large
# machine, the young one at 64 MiB semi-spaces; a 1 GiB export grew a server by 100-150 MiB
# (60-85 with these). Change it with the command (docs/operations.md, Sizing).
CMD ["node", "--max-old-space-size=1536", "--max-semi-space-size=16", "bin/parley.js", "serve"]
