// Stopping a started server and everything it spawned: each is started as the leader of its own process group.

import { setTimeout as sleep } from "node:timers/promises";

/** Whether any process of the group led by `pgid` is still alive. */
export function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch {
    return false;
  }
}

/** SIGTERM to the whole group, SIGKILL whatever is left after `graceMs`, then up to 2 s for it to go. */
export async function stopGroup(pgid: number, graceMs: number): Promise<void> {
  if (!groupAlive(pgid)) return;
  process.kill(-pgid, "SIGTERM");
  for (let waited = 0; waited < graceMs && groupAlive(pgid); waited += 100) await sleep(100);
  if (groupAlive(pgid)) process.kill(-pgid, "SIGKILL");
  for (let waited = 0; waited < 2000 && groupAlive(pgid); waited += 50) await sleep(50);
}
