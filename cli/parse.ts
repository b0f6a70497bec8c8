// Argument parsers shared by the commands: commander reports their errors with the option's name.
import { InvalidArgumentError } from "commander";

export function integerIn(name: string, min: number, max: number): (value: string) => number {
  return (value) => {
    if (!/^-?\d+$/.test(value.trim())) throw new InvalidArgumentError(`${name} must be an integer`);
    const parsed = Number(value);
    if (parsed < min || parsed > max) throw new InvalidArgumentError(`${name} must be in [${min}, ${max}]`);
    return parsed;
  };
}

export function numberIn(name: string, min: number, max: number): (value: string) => number {
  return (value) => {
    const parsed = Number(value);
    if (value.trim() === "" || !Number.isFinite(parsed)) throw new InvalidArgumentError(`${name} must be a number`);
    if (parsed < min || parsed > max) throw new InvalidArgumentError(`${name} must be in [${min}, ${max}]`);
    return parsed;
  };
}

/** For a value checked in the action (a string default, so commander's parser would not see it). */
export function positiveNumber(flag: string, value: string): number {
  const n = Number(value);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`${flag} must be a positive number, not "${value}"`);
  return n;
}
