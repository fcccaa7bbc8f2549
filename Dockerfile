# syntax=docker/dockerfile:1
# Build stage: production dependencies only, from the lockfile, then the server bundle and the
# web console built with them (esbuild is a production dependency for this).
FROM node:20-bookworm-slim AS deps
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund && npm cache clean --force
COPY scripts ./scripts
COPY src ./src
COPY web ./web
RUN node scripts/build.mjs

# Runtime: the bundled server (dist/parley.mjs), as `npm start` runs it; no dev dependencies,
# no root. The sources come along for reference; bin/parley.js prefers the newer bundle.
FROM node:20-bookworm-slim
WORKDIR /app
COPY --from=deps /app/node_modules ./node_modules
COPY package.json ./
COPY bin ./bin
COPY src ./src
COPY migrations ./migrations
COPY --from=deps /app/dist ./dist
COPY --from=deps /app/web/dist ./web/dist
ENV HOST=0.0.0.0 \
    PORT=3000 \
    DATA_DIR=/app/data
RUN mkdir -p /app/data && chown node:node /app/data
USER node
EXPOSE 3000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:'+(process.env.PORT||3000)+'/readyz').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"]
CMD ["node", "bin/parley.js", "serve"]
